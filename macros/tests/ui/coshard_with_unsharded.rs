struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard), semantic(ensemble))]
struct Sample {
    #[featshard(axes(ensemble, tokens), dtype = int64, coshard(axis = 1, follows = 0))]
    frames: Tensor,
}

fn main() {}
