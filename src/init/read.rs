//! Reading the sample: every tensor's dtype, shape and (for small tensors) values, the
//! header's metadata keys, and the lengths the anchors give.

use std::collections::BTreeMap;
use std::path::Path;

use featshard_spec::ir::DType;
use featshard_spec::names::is_feature_name;
use safetensors::{Dtype, SafeTensors};

use super::Anchors;
use crate::commands::Failure;

/// Semantics `init` knows, in declaration order: name and whether it shards.
pub const KNOWN: [(&str, bool); 6] = [
    ("tokens", true),
    ("atoms", true),
    ("msa", true),
    ("rset", true),
    ("ensemble", false),
    ("templates", false),
];

/// Tensors larger than this are described by shape and dtype only.
const MAX_INSPECTED_BYTES: usize = 256 * 1024 * 1024;

pub struct Tensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Values (exact for integers below 2^53), for tensors small enough to inspect.
    pub values: Option<Vec<f64>>,
}

impl Tensor {
    pub fn is_integer(&self) -> bool {
        spec_dtype(self.dtype).is_some_and(DType::is_integer)
    }

    /// Values that are all 0 or 1.
    pub fn zero_one(&self) -> Option<&[f64]> {
        self.values
            .as_deref()
            .filter(|v| v.iter().all(|&x| x == 0.0 || x == 1.0))
    }
}

pub struct Sample {
    /// By feature name: a nested feature's key joined by `separator` is its path.
    pub tensors: BTreeMap<String, Tensor>,
    /// Keys of the header's `__metadata__` (values a tensor cannot hold), but `format`.
    pub metadata: Vec<String>,
    /// How the file joins a nested dict's keys, where not by the spec's `.`.
    pub separator: Option<&'static str>,
}

/// Separators a featurizer's file may join nested keys by, as intake's hint knows them.
const SEPARATORS: [&str; 5] = ["/", "__", ":", "|", "-"];

/// The separator most of the keys that are no feature name join a path of names by
/// (`constraint_feature/contact`), if any: those keys renamed to the spec's paths.
fn nested_paths(tensors: &mut BTreeMap<String, Tensor>) -> Option<&'static str> {
    let joined = |sep: &str| {
        tensors
            .keys()
            .filter(|k| !is_feature_name(k) && k.contains(sep))
            .filter(|k| is_feature_name(&k.replace(sep, featshard_spec::names::PATH)))
            .count()
    };
    let sep = SEPARATORS
        .into_iter()
        .map(|sep| (joined(sep), sep))
        .filter(|&(n, _)| n > 0)
        .max_by_key(|&(n, _)| n)?
        .1;
    let keys: Vec<String> = tensors.keys().cloned().collect();
    for key in keys {
        let name = key.replace(sep, featshard_spec::names::PATH);
        if !is_feature_name(&key) && is_feature_name(&name) && !tensors.contains_key(&name) {
            let t = tensors.remove(&key).expect("listed");
            tensors.insert(name, t);
        }
    }
    Some(sep)
}

/// One anchored semantic: its length is axis 0 of `key`.
pub struct Anchor {
    pub semantic: &'static str,
    pub sharded: bool,
    pub len: usize,
    pub key: String,
}

/// The spec dtype of a safetensors dtype, if a spec can declare it.
pub fn spec_dtype(d: Dtype) -> Option<DType> {
    featshard_exec::dtype::from_safetensors(d)
}

/// Values of a tensor (little-endian, as safetensors stores them) as f64.
fn values(d: Dtype, data: &[u8]) -> Option<Vec<f64>> {
    let d = spec_dtype(d)?;
    let mut out = Vec::with_capacity(data.len() / featshard_exec::dtype::size(d));
    featshard_exec::dtype::decode_into(d, data, &mut out);
    Some(out)
}

pub fn sample(path: &Path) -> Result<Sample, Failure> {
    let mut bytes = Vec::new();
    featshard_exec::files::open_regular(path)
        .map_err(|e| Failure::Other(e.to_string()))
        .and_then(|mut f| {
            std::io::Read::read_to_end(&mut f, &mut bytes)
                .map_err(|e| Failure::Other(format!("cannot read {}: {e}", path.display())))
        })?;
    let bad =
        |e: String| Failure::Other(format!("{}: not a safetensors file: {e}", path.display()));
    let file = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let mut tensors: BTreeMap<String, Tensor> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let small = view.data().len() <= MAX_INSPECTED_BYTES;
            let t = Tensor {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                values: if small {
                    values(view.dtype(), view.data())
                } else {
                    None
                },
            };
            (name, t)
        })
        .collect();
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let mut metadata: Vec<String> = header
        .metadata()
        .as_ref()
        .map(|m| m.keys().filter(|k| *k != "format").cloned().collect())
        .unwrap_or_default();
    metadata.sort();
    let separator = nested_paths(&mut tensors);
    Ok(Sample {
        tensors,
        metadata,
        separator,
    })
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
