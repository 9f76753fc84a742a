//! `featshard init --from sample.safetensors`: a draft spec from one serial sample, as
//! the featurizer emits it.
//!
//! Axis semantics are proposed by matching axis lengths against anchor features (the
//! first axis of `--tokens KEY` has the token length, and so on). A length that matches
//! two semantics is never guessed: the axis becomes `QUESTION(tokens|atoms)`, which the
//! spec check rejects until it is answered. From the values, `init` proposes (marked
//! `# proposed:`): incoming pads (a 0/1 mask that is 1 on a prefix and 0 after), owner
//! counts and owner maps, map rows without an owner, co-sharded one-hot maps, ids of
//! atoms over tokens, the featurizer's own masks (or validity masks the pipeline makes
//! where it has none), lists of ids with a length of their own (`*_index` features),
//! features that are the outer product of a mask, and the header's metadata. Values are
//! read through `crate::values`, as `validate --features` reads them.

mod propose;
mod read;
mod render;

use std::collections::BTreeMap;
use std::path::Path;

use crate::commands::Failure;

/// The anchor feature of each semantic (`--tokens KEY` ...).
pub type Anchors = BTreeMap<String, String>;

/// Writes the draft spec for one sample file.
pub fn draft(path: &Path, anchors: &Anchors, module: &str) -> Result<String, Failure> {
    let sample = read::sample(path).map_err(Failure::Other)?;
    let lengths = read::anchored_lengths(&sample, anchors, path)?;
    let proposals = propose::everything(&sample, &lengths);
    render::spec(path, module, &sample, &lengths, &proposals)
}
