use featshard::tch::Tensor;
use featshard::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard), semantic(ensemble))]
struct Sample {
    #[featshard(axes(ensemble, tokens, 3), dtype = float32, placement("Shard(0)", "Replicate()"))]
    coords: Tensor,
}

fn main() {}
