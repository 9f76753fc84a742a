use featshard::tch::Tensor;
use featshard::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard))]
struct Sample {
    #[featshard(axes(tokens), dtype = float128)]
    plddt: Tensor,
}

fn main() {}
