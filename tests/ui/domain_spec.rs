use featshard::tch::Tensor;
use featshard::Features;

#[derive(Features)]
#[featshard(spec = "../../../../examples/weather.yaml")]
struct Sample {
    state: Tensor,
}

fn main() {}
