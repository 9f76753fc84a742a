use featshard::tch::Tensor;
use featshard::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard))]
struct Sample {
    #[featshard(axes(tokens, residues), dtype = int64)]
    pair: Tensor,
}

fn main() {}
