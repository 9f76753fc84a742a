// The vocabulary for real featurizer output, misused: every error is reported at once,
// each on its attribute.
struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(
    semantic(tokens, shard, incoming_pads(counts)),
    semantic(atoms, shard, owner = tokens, map = atom_to_token, unowned_rows = skip),
    other_keys = keep
)]
struct Sample {
    #[featshard(axes(atoms, tokens), dtype = int64, coshard(axis = 1, follows = 0), index(of = tokens, scope = shard_local, one_hot = 1))]
    atom_to_token: Tensor,
    #[featshard(axes(tokens), dtype = float32, mask(tokens))]
    token_pad_mask: Tensor,
    #[featshard(axes(tokens, tokens), dtype = float32, derive(outer(token_pad_mask, token_pad_mask, token_pad_mask)))]
    token_pair_pad_mask: Option<Tensor>,
}

fn main() {}
