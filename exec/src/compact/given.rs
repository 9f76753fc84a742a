//! One-hot features and maps a sample gives as their indices instead of dense: which
//! inputs are, and a feature's indices read and checked.

use featshard_spec::ir::{DType, Role};
use featshard_spec::plan::TensorPlan;

use super::{OneHot, SCAN_CHUNK};
use crate::array::Array;
use crate::dtype;
use crate::error::ExecError;
use featshard_spec::layout::unravel;

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
pub(crate) fn map_given_as_indices(t: &TensorPlan, dtype: DType, shape: &[usize]) -> bool {
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
pub(crate) fn given_narrow(t: &TensorPlan, dtype: DType) -> bool {
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
pub(crate) fn narrow_hint(t: &TensorPlan) -> String {
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
pub(crate) fn indices_given(
    name: &str,
    x: &Array,
    oh: &OneHot,
) -> Result<Array<'static>, ExecError> {
    let given = x.contiguous();
    let shape = given.shape();
    let d = given.dtype();
    let (es, is) = (dtype::size(d), dtype::size(oh.index));
    let bytes = given.base_bytes();
    let mut out = vec![0u8; given.numel() * is];
    for (c, chunk) in bytes.chunks(SCAN_CHUNK).enumerate() {
        // Read, checked and written a piece at a time, in tight loops per type.
        dtype::by_piece(d, chunk, |p, wide| {
            let first = c * SCAN_CHUNK / es + p;
            as_classes(wide, oh).map_err(|(k, v)| ExecError::OneHot {
                feature: name.to_owned(),
                axis: oh.axis,
                message: format!(
                    "given as indices, {v} names no class of {} (-1: none) at {:?}",
                    oh.classes,
                    unravel(first + k, &shape)
                ),
            })?;
            let at = first * is;
            dtype::write_ints(oh.index, wide, &mut out[at..at + wide.len() * is]);
            Ok::<(), ExecError>(())
        })?;
        // Pages of a mapped sample are given back as the scan passes them.
        given.release_bytes(c * SCAN_CHUNK, c * SCAN_CHUNK + chunk.len());
    }
    Ok(Array::owned(oh.index, shape, out))
}

/// Given indices made classes in place: -1 (none) becomes `classes`, the index of no
/// class. Else the position and value of the first naming no class.
fn as_classes(wide: &mut [i64], oh: &OneHot) -> Result<(), (usize, i64)> {
    let classes = oh.classes as i64;
    // Checked, then mapped, in two branch-free passes the compiler vectorises: -1 and
    // 0..classes are exactly the values whose successor is at most `classes` unsigned.
    let valid = |v: i64| (v.wrapping_add(1) as u64) <= classes as u64;
    if !wide.iter().fold(true, |all, &v| all & valid(v)) {
        let k = wide.iter().position(|&v| !valid(v)).unwrap_or(0);
        return Err((k, wide[k]));
    }
    for v in wide.iter_mut() {
        *v = if *v < 0 { classes } else { *v };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::index_dtype;

    fn one_hot(classes: usize) -> OneHot {
        OneHot {
            axis: 1,
            classes,
            index: index_dtype(classes),
            dense: DType::Int64,
            map: false,
        }
    }

    fn given(values: &[i64], d: DType, shape: Vec<usize>) -> Array<'static> {
        let mut bytes = Vec::new();
        values
            .iter()
            .for_each(|&v| dtype::encode_i64(d, v, &mut bytes));
        Array::owned(d, shape, bytes)
    }

    #[test]
    fn given_indices_become_the_index_dtype_with_none_as_the_class_count() {
        // Longer than one piece, in every integer type a sample may give.
        let values: Vec<i64> = (0..3000)
            .map(|i| if i % 7 == 0 { -1 } else { i % 33 })
            .collect();
        for d in [DType::Uint8, DType::Int16, DType::Int32, DType::Int64] {
            let values: Vec<i64> = values
                .iter()
                .map(|&v| if d == DType::Uint8 { v.max(0) } else { v })
                .collect();
            let got =
                indices_given("res_type", &given(&values, d, vec![3000]), &one_hot(33)).unwrap();
            let want: Vec<u8> = values
                .iter()
                .map(|&v| if v < 0 { 33 } else { v as u8 })
                .collect();
            assert_eq!(
                (got.dtype(), got.base_bytes()),
                (DType::Uint8, &want[..]),
                "{d}"
            );
        }
    }

    #[test]
    fn an_index_naming_no_class_is_refused_at_its_position_past_the_first_piece() {
        for bad in [40, 33, -2, i64::MAX, i64::MIN] {
            let mut values = vec![3i64; 3 * 1000];
            values[2500] = bad;
            let x = given(&values, DType::Int64, vec![3, 1000]);
            let err = indices_given("res_type", &x, &one_hot(33))
                .unwrap_err()
                .to_string();
            let want =
                format!("given as indices, {bad} names no class of 33 (-1: none) at [2, 500]");
            assert!(err.contains(&want), "{err}");
        }
    }
}
