// trybuild compiles this in target/tests/trybuild/featshard, the manifest dir that
// spec paths are relative to.
struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(spec = "../../../../macros/tests/ui/small.yaml")]
struct Sample {
    atom_counts: Tensor,
    #[featshard(dtype = float64)]
    ref_pos: Tensor,
    token_pad_mask: Tensor,
}

fn main() {}
