// A derived feature's axes must be those of the outer product it is made as; the spec
// check reports it on the field.
struct Tensor; // tch's stands here: the derive reads field types by name
use featshard_macros::Features;

#[derive(Features)]
#[featshard(semantic(tokens, shard), semantic(msa, shard))]
struct Sample {
    #[featshard(axes(tokens), dtype = float32, mask(tokens))]
    token_pad_mask: Tensor,
    #[featshard(axes(tokens, msa), dtype = float32, derive(outer(token_pad_mask)))]
    token_pair_pad_mask: Option<Tensor>,
}

fn main() {}
