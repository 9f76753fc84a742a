struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard))]
struct Sample {
    #[featshard(axes(tokens), dtype = int64)]
    token_index: Tensor,
    #[featshard(name = "token_index", axes(tokens), dtype = int64)]
    also_token_index: Tensor,
}

fn main() {}
