use featshard::tch::Tensor;
use featshard::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard))]
struct Sample {
    #[featshard(axes(tokens), dtype = float32)]
    plddt: Vec<f32>,
    #[featshard(axes(tokens), dtype = float32)]
    ok: Tensor,
}

fn main() {}
