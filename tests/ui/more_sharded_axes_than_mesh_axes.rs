use featshard::tch::Tensor;
use featshard::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard))]
struct Sample {
    #[featshard(axes(tokens, tokens, tokens), dtype = float32)]
    triangle: Tensor,
}

fn main() {}
