//! A sample's values as the checks read them: every tensor's dtype, shape and (for
//! small tensors) values, the header's metadata keys, and a nested dict's keys as the
//! spec's paths. `init` drafts from them and `validate --features` checks a spec against
//! them, through the same readers ([`shows`]), so a draft never proposes what the check
//! would flag.

pub mod shows;

use std::collections::BTreeMap;
use std::path::Path;

use featshard_spec::ir::DType;
use featshard_spec::names::is_feature_name;
use safetensors::{Dtype, SafeTensors};

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

/// Reads a sample file; the error says why, naming the file.
pub fn sample(path: &Path) -> Result<Sample, String> {
    let mut bytes = Vec::new();
    featshard_exec::files::open_regular(path)
        .map_err(|e| e.to_string())
        .and_then(|mut f| {
            std::io::Read::read_to_end(&mut f, &mut bytes)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
        })?;
    let bad = |e: String| format!("{}: not a safetensors file: {e}", path.display());
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
