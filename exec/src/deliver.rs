//! A map the sample gives in one form and the spec delivers in the other
//! (`TensorPlan::given`): intake's way in (a dense one-hot map read as the id of each
//! row's item) and `assemble`'s way back (the serial delivered map in the given form).
//! An id vector given for a one-hot map needs no way in of its own: it is a one-hot map
//! given as its indices (`intake::maps_from_indices`).

use featshard_spec::ir::{DType, GivenForm, PadValue, Role};
use featshard_spec::plan::{SampleLayout, TensorPlan};

use crate::array::Array;
use crate::dense::Dense;
use crate::dtype;
use crate::error::ExecError;

/// A dense one-hot map `x` (`[rows, items]`, given for a map delivered as ids) as the
/// `int64` id of each row's item, [`GivenForm::NONE`] for a row of zeros; a value other
/// than 0 and 1, or a second 1 in a row, is refused naming the row.
pub(crate) fn one_hot_to_ids(name: &str, x: &Array) -> Result<Array<'static>, ExecError> {
    let refuse = |row: usize, message: String| ExecError::OneHot {
        feature: name.to_owned(),
        axis: 1,
        message: format!("given as a one-hot map, row {row} {message}"),
    };
    let mut bytes = Vec::with_capacity(x.shape().first().copied().unwrap_or(0) * 8);
    x.for_each_row_nonzero(|idx, nz| {
        let row = idx.first().copied().unwrap_or(0);
        if let Some(&(c, v)) = nz.iter().find(|&&(_, v)| v != 1.0) {
            return Err(refuse(
                row,
                format!("holds {v} at column {c} (a one-hot map is 0s and 1s)"),
            ));
        }
        let id = match nz {
            [] => GivenForm::NONE,
            [(c, _)] => *c as i64,
            [(a, _), (b, _), ..] => {
                return Err(refuse(
                    row,
                    format!("has a 1 at columns {a} and {b}: one item per row"),
                ))
            }
        };
        dtype::encode_i64(DType::Int64, id, &mut bytes);
        Ok(())
    })?;
    Ok(Array::owned(DType::Int64, vec![x.shape()[0]], bytes))
}

/// The serial feature `y` of `t` in the form the sample gave it: ids back to a one-hot
/// map as wide as the serial items it points at, or a one-hot map back to ids.
pub(crate) fn to_given(
    name: &str,
    t: &TensorPlan,
    layout: &SampleLayout,
    y: Dense,
) -> Result<Dense, ExecError> {
    let (Some(given), Role::Index(ix)) = (&t.given, &t.role) else {
        return Ok(y);
    };
    let refuse = |message: String| ExecError::Blocks {
        feature: name.to_owned(),
        message,
    };
    match given {
        GivenForm::OneHot { dtype } => {
            let width = layout
                .sizes
                .get(&ix.of)
                .copied()
                .ok_or_else(|| refuse(format!("the layout has no length for `{}`", ix.of)))?;
            ids_to_one_hot(&y, *dtype, width).map_err(|(r, c)| {
                refuse(format!(
                    "row {r} names `{}` {c}, past its {width} items",
                    ix.of
                ))
            })
        }
        GivenForm::Ids { dtype, none } => {
            one_hot_to_given_ids(&y, *dtype, *none).map_err(|(r, n)| {
                refuse(format!(
                    "row {r} of the one-hot map names {n} items, not one"
                ))
            })
        }
    }
}

/// Ids (`[rows]`, [`GivenForm::NONE`] for none) as a one-hot map `width` wide of `dtype`;
/// else the first row whose id is past the width, and the id.
fn ids_to_one_hot(y: &Dense, dtype: DType, width: usize) -> Result<Dense, (usize, i64)> {
    let rows = y.shape.first().copied().unwrap_or(0);
    let (zero, one) = (
        dtype::pad_bytes(dtype, PadValue::Int(0)),
        dtype::pad_bytes(dtype, PadValue::Int(1)),
    );
    let mut bytes = zero.repeat(rows * width);
    for (r, v) in y.bytes.chunks_exact(dtype::size(y.dtype)).enumerate() {
        match dtype::read_i64(y.dtype, v) {
            GivenForm::NONE => {}
            c if (0..width as i64).contains(&c) => {
                let at = (r * width + c as usize) * one.len();
                bytes[at..at + one.len()].copy_from_slice(&one);
            }
            c => return Err((r, c)),
        }
    }
    Ok(Dense {
        dtype,
        shape: vec![rows, width],
        bytes,
    })
}

/// A one-hot map (`[rows, items]`) as each row's item id of `dtype`, `none` for a row of
/// zeros; else the first row naming another count of items than one, and that count.
fn one_hot_to_given_ids(
    y: &Dense,
    dtype: DType,
    none: Option<i64>,
) -> Result<Dense, (usize, usize)> {
    let rows = y.shape.first().copied().unwrap_or(0);
    let width = y.shape.get(1).copied().unwrap_or(0);
    let es = dtype::size(y.dtype);
    let mut bytes = Vec::with_capacity(rows * dtype::size(dtype));
    for (r, row) in y.bytes.chunks(width.max(1) * es).take(rows).enumerate() {
        let ones: Vec<usize> = row
            .chunks_exact(es)
            .enumerate()
            .filter(|(_, v)| dtype::read_i64(y.dtype, v) != 0)
            .map(|(c, _)| c)
            .collect();
        let id = match (ones.as_slice(), none) {
            ([c], _) => *c as i64,
            ([], Some(n)) => n,
            _ => return Err((r, ones.len())),
        };
        dtype::encode_i64(dtype, id, &mut bytes);
    }
    Ok(Dense {
        dtype,
        shape: vec![rows],
        bytes,
    })
}
