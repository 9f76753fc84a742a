struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard))]
struct Sample {
    #[featshard(axes = tokens, dtype = int64)]
    token_index: Tensor,
    #[featshard(axes(tokens), dtyp = int64)]
    residue_index: Tensor,
}

fn main() {}
