struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard), semantic(ensemble))]
struct Sample {
    #[featshard(axes(ensemble, tokens, 3), dtype = float32, placement("Shard(0)", "Replicate()"))]
    coords: Tensor,
}

fn main() {}
