//! One-hot features and maps a sample gives as their indices instead of dense: which
//! inputs are, and a feature's indices read and checked.

use featshard_spec::ir::{DType, Role};
use featshard_spec::plan::TensorPlan;

use super::{unravel, OneHot, SCAN_CHUNK};
use crate::array::Array;
use crate::dtype;
use crate::error::RuntimeError;

/// Whether feature `t`, given with `dtype` and `shape`, arrives as its one-hot
/// indices: a feature declared `one_hot` on its last axis, given with that axis left
/// out, as integers (each row's class, -1 for a row with none).
pub fn given_as_indices(t: &TensorPlan, dtype: DType, shape: &[usize]) -> bool {
    t.one_hot.is_some_and(|a| a + 1 == t.axes.len())
        && shape.len() + 1 == t.axes.len()
        && dtype.is_integer()
}

/// Whether feature `t`, given with `dtype` and `shape`, is a one-hot map (`[rows,
/// items]`, as `atom_to_token`) given as its indices: the column of each row's 1 as
/// integers, -1 for a row with none.
pub fn map_given_as_indices(t: &TensorPlan, dtype: DType, shape: &[usize]) -> bool {
    matches!(&t.role, Role::Index(ix) if ix.one_hot == Some(1))
        && t.axes.len() == 2
        && shape.len() == 1
        && dtype.is_integer()
}

/// Whether feature `t`, given as `dtype`, arrives in a narrower type that holds every
/// value it may hold exactly: a mask as `bool`, a ranged integer feature as an integer
/// type holding its range. Its blocks are the declared dtype's, widened as written.
/// Derived features are made in the declared dtype, and sparse and one-hot ones have
/// compact forms of their own: none of them is taken narrowed.
pub fn given_narrow(t: &TensorPlan, dtype: DType) -> bool {
    let plain = t.derived.is_none() && !t.sparse && t.one_hot.is_none();
    if !plain || dtype == t.dtype || dtype::size(dtype) >= dtype::size(t.dtype) {
        return false;
    }
    match (&t.role, t.range) {
        (Role::Mask { .. }, _) => dtype == DType::Bool,
        (Role::Data, Some([lo, hi])) => dtype.int_range().is_some_and(|(a, b)| a <= lo && hi <= b),
        _ => false,
    }
}

/// What else a feature may be given as besides its declared dtype, for a message:
/// ` (or bool: a mask)`, ` (or an integer type holding its range [lo, hi])`, or empty.
pub fn narrow_hint(t: &TensorPlan) -> String {
    if given_narrow(t, DType::Bool) {
        return " (or bool: a mask)".into();
    }
    match t.range {
        Some([lo, hi]) if given_narrow(t, DType::Int32) || given_narrow(t, DType::Uint8) => {
            format!(" (or an integer type holding its range [{lo}, {hi}])")
        }
        _ => String::new(),
    }
}

/// The indices of one-hot feature `name` given as its indices (`x`, see
/// [`given_as_indices`]), in the form [`indices`] makes: every value names a class or
/// is -1 (no class), else it is refused naming the feature, the axis and the position.
pub fn indices_given(name: &str, x: &Array, oh: &OneHot) -> Result<Array<'static>, RuntimeError> {
    let given = x.contiguous();
    let shape = given.shape();
    let (d, es) = (given.dtype(), dtype::size(given.dtype()));
    let bytes = given.base_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(given.numel() * dtype::size(oh.index));
    for (c, chunk) in bytes.chunks(SCAN_CHUNK).enumerate() {
        let first = c * SCAN_CHUNK / es;
        for (k, e) in chunk.chunks_exact(es).enumerate() {
            let class = match dtype::read_i64(d, e) {
                -1 => oh.classes,
                v if (0..oh.classes as i64).contains(&v) => v as usize,
                v => {
                    return Err(RuntimeError::OneHot {
                        feature: name.to_owned(),
                        axis: oh.axis,
                        message: format!(
                            "given as indices, {v} names no class of {} (-1: none) at {:?}",
                            oh.classes,
                            unravel(first + k, &shape)
                        ),
                    })
                }
            };
            dtype::encode_i64(oh.index, class as i64, &mut out);
        }
        given.release_bytes(c * SCAN_CHUNK, c * SCAN_CHUNK + chunk.len());
    }
    Ok(Array::owned(oh.index, shape, out))
}
