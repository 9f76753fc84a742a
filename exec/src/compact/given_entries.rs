//! Sparse features a sample gives as their nonzero elements instead of dense: two keys,
//! `NAME.indices` (`[axes, n]` integers, the coordinate of each element along every
//! axis, as torch's COO layout holds them) and `NAME.values` (`[n]`, the feature's
//! dtype). The dense feature is never made: its blocks are written from the elements.

use std::collections::BTreeMap;

use featshard_spec::ir::DType;
use featshard_spec::limits;
use featshard_spec::plan::{Plan, TensorPlan};

use super::bits;
use crate::alloc;
use crate::array::{Array, EntryList};
use crate::dtype;
use crate::error::ExecError;
use crate::files::Sample;

/// The key of a sparse feature's coordinates.
pub const INDICES: &str = ".indices";
/// The key of a sparse feature's values.
pub const VALUES: &str = ".values";
/// The key of a sparse feature's dense shape, optional (a sparse tensor's own size):
/// when given, it must be the shape the plan and the other features make.
pub const SHAPE: &str = ".shape";

/// `features` with every sparse feature given as its elements made one array known by
/// them ([`Array::from_entries`]), as long along each semantic axis as the other
/// features say. Coordinates outside the feature, an element given twice, a shape
/// that is not the feature's, or one half of the pair without the other are refused
/// naming the feature (and the axis).
pub(crate) fn entries_from_pairs<'a>(
    plan: &Plan,
    features: &Sample<'a>,
) -> Result<Sample<'a>, ExecError> {
    let mut out = features.clone();
    for (name, t) in plan.tensors().filter(|(_, t)| t.sparse) {
        let keys = [INDICES, VALUES, SHAPE].map(|k| format!("{name}{k}"));
        let [ik, vk, sk] = &keys;
        let fault = |message: String| ExecError::Entries {
            feature: name.to_owned(),
            message,
        };
        let given_shape = out.remove(sk);
        let (indices, values) = match (out.remove(ik), out.remove(vk)) {
            (None, None) if given_shape.is_none() => continue,
            (Some(i), Some(v)) => (i, v),
            _ => {
                return Err(fault(format!(
                    "given as elements needs both `{ik}` and `{vk}` (`{sk}` is optional)"
                )))
            }
        };
        if out.contains_key(name) {
            return Err(fault(format!("given both dense and as `{ik}`/`{vk}`")));
        }
        let shape = dense_shape(plan, name, t, &out).map_err(fault)?;
        if let Some(given) = given_shape {
            check_given_shape(&given, &shape).map_err(fault)?;
        }
        let list = entry_list(name, t, &shape, &indices, &values)?;
        out.insert(name.to_owned(), Array::from_entries(t.dtype, shape, list));
    }
    Ok(out)
}

/// The elements' axis count and number, when `indices` is `[axes, n]` integers and
/// `values` `[n]` of the feature's dtype.
fn pair_shape(
    t: &TensorPlan,
    shape: &[usize],
    indices: &Array,
    values: &Array,
) -> Result<(usize, usize), String> {
    let (rank, n) = match indices.shape()[..] {
        [r, n] if r == shape.len() && indices.dtype().is_integer() => (r, n),
        _ => {
            return Err(format!(
                "`.indices` holds each element's coordinate along its {} axes, as integers `[{}, n]`; given {:?} {}",
                shape.len(),
                shape.len(),
                indices.shape(),
                indices.dtype()
            ))
        }
    };
    if values.shape() != [n] || values.dtype() != t.dtype {
        return Err(format!(
            "`.values` holds the {n} elements as {}; given {:?} {}",
            t.dtype,
            values.shape(),
            values.dtype()
        ));
    }
    Ok((rank, n))
}

/// `n` elements within [`limits::MAX_ENTRIES`], and a dense form of `shape` whose
/// element count fits an int64 (so that no flat position wraps).
fn check_counts(name: &str, shape: &[usize], n: usize) -> Result<(), ExecError> {
    let too_large = |message: String| ExecError::TooLarge {
        feature: name.to_owned(),
        message,
    };
    if n > limits::MAX_ENTRIES {
        return Err(too_large(format!(
            "given as {n} elements, more than the limit of {}",
            limits::MAX_ENTRIES
        )));
    }
    let numel = shape.iter().try_fold(1u64, |a, &k| a.checked_mul(k as u64));
    if numel.is_none_or(|e| e > i64::MAX as u64) {
        return Err(too_large(format!(
            "its dense shape {shape:?} has more than {} elements, the most a tensor can hold",
            i64::MAX
        )));
    }
    Ok(())
}

/// A sparse feature's own shape (`NAME.shape`, one integer an axis) is the shape the
/// plan and the other features make.
fn check_given_shape(given: &Array, shape: &[usize]) -> Result<(), String> {
    let dims = (given.dim() == 1 && given.dtype().is_integer() && given.numel() <= 64)
        .then(|| given.values())
        .filter(|v| v.len() == shape.len());
    let Some(dims) = dims else {
        return Err(format!(
            "`.shape` holds the dense shape, one integer for each of its {} axes; given {:?} {}",
            shape.len(),
            given.shape(),
            given.dtype()
        ));
    };
    let same = dims.iter().zip(shape).all(|(&d, &n)| d == n as f64);
    if !same {
        let text: Vec<String> = given
            .contiguous()
            .to_bytes()
            .chunks(dtype::size(given.dtype()))
            .map(|b| dtype::read_i64(given.dtype(), b).to_string())
            .collect();
        return Err(format!(
            "given as a sparse tensor of shape [{}], but the sample's other features make it {shape:?}",
            text.join(", ")
        ));
    }
    Ok(())
}

/// The dense shape of sparse feature `name`: channel sizes from the plan, semantic
/// lengths from the other features.
fn dense_shape(
    plan: &Plan,
    name: &str,
    t: &TensorPlan,
    others: &Sample,
) -> Result<Vec<usize>, String> {
    let mut lengths: BTreeMap<&str, usize> = BTreeMap::new();
    t.axes
        .iter()
        .map(|a| match (&a.semantic, a.size) {
            (_, Some(n)) => usize::try_from(n).map_err(|_| format!("channel size {n}")),
            (Some(s), None) => {
                if let Some(&n) = lengths.get(s.as_str()) {
                    return Ok(n);
                }
                let n = others
                    .iter()
                    .filter(|(n, _)| *n != name)
                    .find_map(|(n, x)| crate::feature::axis_length(plan, n, x, s))
                    .ok_or_else(|| {
                        format!("given as elements, but no other feature gives the length of `{s}`")
                    })?;
                lengths.insert(s, n);
                Ok(n)
            }
            (None, None) => Err("an axis with neither a semantic nor a size".to_owned()),
        })
        .collect()
}

/// The elements `indices` and `values` give, checked, as flat positions in `shape`,
/// ascending; elements whose bits are zero are left out (as a dense zero is no entry).
/// Their count and the dense form's element count are bounded before anything is
/// allocated from them.
fn entry_list(
    name: &str,
    t: &TensorPlan,
    shape: &[usize],
    indices: &Array,
    values: &Array,
) -> Result<EntryList, ExecError> {
    let fault = |message: String| ExecError::Entries {
        feature: name.to_owned(),
        message,
    };
    let (rank, n) = pair_shape(t, shape, indices, values).map_err(fault)?;
    check_counts(name, shape, n)?;
    let (ib, vb) = (indices.contiguous(), values.contiguous());
    let (ies, ves) = (dtype::size(indices.dtype()), dtype::size(t.dtype));
    let coord = |d: usize, k: usize| {
        let at = (d * n + k) * ies;
        dtype::read_i64(indices.dtype(), &ib.base_bytes()[at..at + ies])
    };
    let mut pairs: Vec<(usize, u64, usize)> =
        alloc::with_capacity(&format!("feature `{name}`'s {n} elements"), n, 24)?;
    for k in 0..n {
        // Below the element count, which fits an int64: no position wraps.
        let mut flat = 0usize;
        for (d, &len) in shape.iter().enumerate().take(rank) {
            let c = coord(d, k);
            if !(0..len as i64).contains(&c) {
                return Err(fault(format!(
                    "element {k}: coordinate {c} along axis {d} is outside its {len} items"
                )));
            }
            flat = flat * len + c as usize;
        }
        let v = bits(&vb.base_bytes()[k * ves..(k + 1) * ves]);
        if t.dtype == DType::Bool && v > 1 {
            return Err(fault(format!(
                "element {k}: a bool holds byte 0 (false) or 1 (true), given byte {v}"
            )));
        }
        if v != 0 {
            pairs.push((flat, v, k));
        }
    }
    pairs.sort_unstable();
    if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(fault(format!(
            "elements {} and {} are at the same coordinate (a sparse tensor's duplicates: coalesce it first if they mean their sum)",
            w[0].2.min(w[1].2),
            w[0].2.max(w[1].2)
        )));
    }
    Ok(EntryList {
        positions: pairs.iter().map(|p| p.0).collect(),
        bits: pairs.iter().map(|p| p.1).collect(),
    })
}
