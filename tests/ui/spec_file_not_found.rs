use featshard::tch::Tensor;
use featshard::Features;

#[derive(Features)]
#[featshard(spec = "examples/no_such_spec.yaml")]
struct Sample {
    ref_pos: Tensor,
}

fn main() {}
