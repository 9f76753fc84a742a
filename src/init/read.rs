//! Reading the sample: every tensor's dtype, shape and (for small tensors) values, the
//! header's metadata keys, and the lengths the anchors give.

use std::path::Path;

use super::Anchors;
use crate::commands::Failure;
pub use crate::values::{sample, spec_dtype, Sample, Tensor};

/// Semantics `init` knows, in declaration order: name and whether it shards.
pub const KNOWN: [(&str, bool); 6] = [
    ("tokens", true),
    ("atoms", true),
    ("msa", true),
    ("rset", true),
    ("ensemble", false),
    ("templates", false),
];

/// One anchored semantic: its length is axis 0 of `key`.
pub struct Anchor {
    pub semantic: &'static str,
    pub sharded: bool,
    pub len: usize,
    pub key: String,
}

/// Keys whose axis 0 counts a semantic in the featurizers featshard knows (Boltz-2,
/// the AlphaFold3 family), tried in order when its anchor is not given.
const USUAL_ANCHORS: [(&str, &[&str]); 6] = [
    (
        "tokens",
        &["token_index", "residue_index", "restype", "res_type"],
    ),
    ("atoms", &["ref_pos", "atom_to_token_idx", "atom_to_token"]),
    ("msa", &["msa"]),
    ("rset", &["r_set_to_rep_atom"]),
    ("ensemble", &[]),
    ("templates", &["template_restype"]),
];

/// The anchor of `semantic`: the one given, else the first usual key the sample has
/// (with at least one axis).
fn anchor_of<'a>(semantic: &str, anchors: &'a Anchors, sample: &'a Sample) -> Option<&'a String> {
    if let Some(key) = anchors.get(semantic) {
        return Some(key);
    }
    let usual = USUAL_ANCHORS.iter().find(|(s, _)| *s == semantic)?.1;
    usual.iter().find_map(|k| {
        let (key, t) = sample.tensors.get_key_value(*k)?;
        (!t.shape.is_empty()).then_some(key)
    })
}

/// The lengths of the anchored semantics: each given anchor's axis 0, or where none is
/// given, a usual key's the sample has.
pub fn anchored_lengths(
    sample: &Sample,
    anchors: &Anchors,
    path: &Path,
) -> Result<Vec<Anchor>, Failure> {
    let mut out = Vec::new();
    for (semantic, sharded) in KNOWN {
        let Some(key) = anchor_of(semantic, anchors, sample) else {
            continue;
        };
        let t = sample.tensors.get(key).ok_or_else(|| {
            Failure::Other(format!(
                "--{semantic} {key}: no feature `{key}` in {}",
                path.display()
            ))
        })?;
        let len = *t.shape.first().ok_or_else(|| {
            Failure::Other(format!(
                "--{semantic} {key}: feature `{key}` is a scalar, it has no axis 0"
            ))
        })?;
        out.push(Anchor {
            semantic,
            sharded,
            len,
            key: key.clone(),
        });
    }
    if out.is_empty() {
        return Err(Failure::Other(
            "no usual key tells a length (token_index, ref_pos, msa, ...): give at least one anchor, e.g. --tokens token_index --atoms ref_pos".into(),
        ));
    }
    Ok(out)
}
