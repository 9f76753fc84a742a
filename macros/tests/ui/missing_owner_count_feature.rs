struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard), semantic(atoms, shard, owner = tokens, counts = atoms_per_token))]
struct Sample {
    #[featshard(axes(atoms, 3), dtype = float32)]
    ref_pos: Tensor,
}

fn main() {}
