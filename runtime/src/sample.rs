//! One sample as tch tensors, and the small helpers the runtime shares. Validation of a
//! sample runs in the byte executor (`featshard_exec::validate`), on views of these
//! tensors (see `views`).

use std::collections::BTreeMap;

use tch::{Kind, Tensor};

use crate::error::{RuntimeError, TorchContext};

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

/// Reads a small integer tensor into a vector.
pub(crate) fn to_vec_i64(x: &Tensor, name: &str) -> Result<Vec<i64>, RuntimeError> {
    let flat = x
        .f_to_kind(Kind::Int64)
        .feature(name)?
        .f_flatten(0, -1)
        .feature(name)?;
    Vec::<i64>::try_from(&flat).feature(name)
}
