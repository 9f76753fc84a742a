//! A feature's plan found by name, and a small feature's values read: what intake,
//! validation and placement all ask of one feature.

use featshard_spec::plan::{Plan, TensorPlan};

use crate::array::Array;
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
