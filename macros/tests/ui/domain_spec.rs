struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(spec = "../../../../examples/weather.yaml")]
struct Sample {
    state: Tensor,
}

fn main() {}
