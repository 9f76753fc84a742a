//! A feature's plan found by name, and a small feature's values read: what intake,
//! validation and placement all ask of one feature.

use featshard_spec::ir::Role;
use featshard_spec::plan::{Plan, TensorPlan};

use crate::array::Array;
use crate::dtype;
use crate::error::ExecError;

/// The tensor plan of a feature; metadata and unknown names are `Missing`.
pub fn tensor_plan<'p>(plan: &'p Plan, name: &str) -> Result<&'p TensorPlan, ExecError> {
    plan.tensor(name).ok_or_else(|| ExecError::Missing {
        feature: name.to_owned(),
    })
}

/// A small feature's values as integers (floats truncated toward zero).
pub(crate) fn to_i64(x: &Array) -> Vec<i64> {
    x.values().into_iter().map(|v| v as i64).collect()
}

/// An owner map read as a one-hot `[items, owner]` map: as it is, or, for an id vector
/// (`[items]`, AlphaFold3's `atom_to_token_idx`), its ids as a map known by its rows,
/// `width` owners wide, the declared none naming no owner. Any other id outside the
/// owners is refused naming the map, the item and the id.
pub(crate) fn owner_map<'a>(
    plan: &Plan,
    name: &str,
    x: &Array<'a>,
    owner: &str,
    width: usize,
) -> Result<Array<'a>, ExecError> {
    let t = tensor_plan(plan, name)?;
    let none = match &t.role {
        Role::Index(ix) if t.axes.len() == 1 && x.dim() == 1 => ix.none,
        _ => return Ok(x.clone()),
    };
    let rows = id_rows(x, width, none).map_err(|(k, v)| ExecError::Ownership {
        feature: name.to_owned(),
        axis: 0,
        semantic: owner.to_owned(),
        message: format!(
            "item {k} names `{owner}` {v}, which is no item of the {width} `{owner}`{}",
            none.map_or(String::new(), |n| format!(" (nor the none value {n})"))
        ),
    })?;
    Ok(Array::one_hot_rows(t.dtype, &rows, width))
}

/// The item each value of an integer vector names, of `width` items (`None` for the
/// `none` value), read as integers of their own dtype (no value rounded through a
/// float); else the position and value of the first that names none.
pub(crate) fn id_rows(
    x: &Array,
    width: usize,
    none: Option<i64>,
) -> Result<Vec<Option<usize>>, (usize, i64)> {
    let given = x.contiguous();
    let es = dtype::size(given.dtype());
    let mut rows = Vec::with_capacity(given.numel());
    for (k, b) in given.base_bytes().chunks_exact(es).enumerate() {
        rows.push(match dtype::read_i64(given.dtype(), b) {
            v if Some(v) == none => None,
            v if (0..width as i64).contains(&v) => Some(v as usize),
            v => return Err((k, v)),
        });
    }
    Ok(rows)
}

/// The sum of every row of a 2-D `[items, owner]` map.
pub(crate) fn row_sums(plan: &Plan, name: &str, x: &Array) -> Result<Vec<f64>, ExecError> {
    two_d(plan, name, x)?;
    let mut sums = Vec::with_capacity(x.shape()[0]);
    let _ = x.for_each_row_nonzero(|_, nz| {
        sums.push(nz.iter().map(|&(_, v)| v).sum());
        Ok::<(), ()>(())
    });
    Ok(sums)
}

pub(crate) fn two_d(plan: &Plan, name: &str, x: &Array) -> Result<(), ExecError> {
    if x.dim() == 2 {
        return Ok(());
    }
    Err(ExecError::Rank {
        feature: name.to_owned(),
        expected: tensor_plan(plan, name).map_or(2, |t| t.axes.len()),
        got: x.shape().iter().map(|&d| d as i64).collect(),
    })
}

/// The length of feature `name`'s axis of `semantic`, when it has one of its declared
/// rank (a map given as indices has no axis for its items).
pub(crate) fn axis_length(plan: &Plan, name: &str, x: &Array, semantic: &str) -> Option<usize> {
    let t = plan.tensor(name)?;
    if t.axes.len() != x.dim() {
        return None;
    }
    let d = t
        .axes
        .iter()
        .position(|a| a.semantic.as_deref() == Some(semantic))?;
    Some(x.shape()[d])
}
