//! One sample as tch tensors, and the small helpers the runtime shares. Validation of a
//! sample runs in the byte executor (`featshard_exec::validate`), on views of these
//! tensors (see `views`).

use std::collections::BTreeMap;

use tch::Tensor;

/// One sample: feature name -> tensor.
pub type Features = BTreeMap<String, Tensor>;

pub use featshard_exec::validate::Checked;
pub use featshard_exec::Options;

/// Other handles on the same tensors, for another thread.
pub(crate) fn handles(features: &Features) -> Features {
    features
        .iter()
        .map(|(n, x)| (n.clone(), x.shallow_clone()))
        .collect()
}

pub use featshard_exec::tensor_plan;
