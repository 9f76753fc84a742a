struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(module = "a", semantic(tokens, shard, shard))]
#[featshard(module = "b")]
struct Sample {
    #[featshard(axes(tokens), dtype = int64, dtype = float32)]
    token_index: Tensor,
    #[featshard(axes(tokens), dtype = float32, replicated, replicated)]
    residue_weight: Tensor,
}

fn main() {}
