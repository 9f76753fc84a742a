// trybuild compiles this in target/tests/trybuild/featshard, the manifest dir that
// spec paths are relative to. Every sample holds `ref_pos`: its field cannot be optional.
struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(spec = "../../../../macros/tests/ui/small.yaml")]
struct Sample {
    atom_counts: Tensor,
    ref_pos: Option<Tensor>,
    token_pad_mask: Tensor,
}

fn main() {}
