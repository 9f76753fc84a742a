// trybuild compiles this in target/tests/trybuild/featshard, the manifest dir that
// spec paths are relative to.
struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(spec = "../../../../macros/tests/ui/small.yaml")]
struct Sample {
    atom_counts: Tensor,
    ref_pos: Tensor,
    token_pad_mask: Tensor,
    plddt: Tensor,
}

fn main() {}
