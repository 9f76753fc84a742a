use featshard::tch::Tensor;
use featshard::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard))]
struct Sample {
    #[featshard(axes(tokens), dtype = int64)]
    token_index: Tensor,
    #[featshard(name = "token_index", axes(tokens), dtype = int64)]
    also_token_index: Tensor,
}

fn main() {}
