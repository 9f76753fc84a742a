struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(spec = "examples/no_such_spec.yaml")]
struct Sample {
    ref_pos: Tensor,
}

fn main() {}
