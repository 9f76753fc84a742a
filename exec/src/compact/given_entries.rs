//! Sparse features a sample gives as their nonzero elements instead of dense: two keys,
//! `NAME.indices` (`[axes, n]` integers, the coordinate of each element along every
//! axis, as torch's COO layout holds them) and `NAME.values` (`[n]`, the feature's
//! dtype). The dense feature is never made: its blocks are written from the elements.

use std::collections::BTreeMap;

use featshard_spec::plan::{Plan, TensorPlan};

use super::bits;
use crate::array::{Array, EntryList};
use crate::dtype;
use crate::error::RuntimeError;
use crate::files::Sample;

/// The key of a sparse feature's coordinates.
pub const INDICES: &str = ".indices";
/// The key of a sparse feature's values.
pub const VALUES: &str = ".values";

/// `features` with every sparse feature given as its elements made one array known by
/// them ([`Array::from_entries`]), as long along each semantic axis as the other
/// features say. Coordinates outside the feature, an element given twice, or one half
/// of the pair without the other are refused naming the feature (and the axis).
pub fn entries_from_pairs<'a>(
    plan: &Plan,
    features: &Sample<'a>,
) -> Result<Sample<'a>, RuntimeError> {
    let mut out = features.clone();
    for (name, t) in plan.tensors().filter(|(_, t)| t.sparse) {
        let (ik, vk) = (format!("{name}{INDICES}"), format!("{name}{VALUES}"));
        let fault = |message: String| RuntimeError::Entries {
            feature: name.to_owned(),
            message,
        };
        let (indices, values) = match (out.remove(&ik), out.remove(&vk)) {
            (None, None) => continue,
            (Some(i), Some(v)) => (i, v),
            _ => {
                return Err(fault(format!(
                    "given as elements needs both `{ik}` and `{vk}`"
                )))
            }
        };
        if out.contains_key(name) {
            return Err(fault(format!("given both dense and as `{ik}`/`{vk}`")));
        }
        let shape = dense_shape(plan, name, t, &out).map_err(fault)?;
        let list = entry_list(t, &shape, &indices, &values).map_err(fault)?;
        out.insert(name.to_owned(), Array::from_entries(t.dtype, shape, list));
    }
    Ok(out)
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
                    .find_map(|(n, x)| crate::intake::axis_length(plan, n, x, s))
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
fn entry_list(
    t: &TensorPlan,
    shape: &[usize],
    indices: &Array,
    values: &Array,
) -> Result<EntryList, String> {
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
    let (ib, vb) = (indices.contiguous(), values.contiguous());
    let (ies, ves) = (dtype::size(indices.dtype()), dtype::size(t.dtype));
    let coord = |d: usize, k: usize| {
        let at = (d * n + k) * ies;
        dtype::read_i64(indices.dtype(), &ib.base_bytes()[at..at + ies])
    };
    let mut pairs = Vec::with_capacity(n);
    for k in 0..n {
        let mut flat = 0usize;
        for (d, &len) in shape.iter().enumerate().take(rank) {
            let c = coord(d, k);
            if !(0..len as i64).contains(&c) {
                return Err(format!(
                    "element {k}: coordinate {c} along axis {d} is outside its {len} items"
                ));
            }
            flat = flat * len + c as usize;
        }
        let v = bits(&vb.base_bytes()[k * ves..(k + 1) * ves]);
        if v != 0 {
            pairs.push((flat, v, k));
        }
    }
    pairs.sort_unstable();
    if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!(
            "elements {} and {} are at the same coordinate",
            w[0].2.min(w[1].2),
            w[0].2.max(w[1].2)
        ));
    }
    Ok(EntryList {
        positions: pairs.iter().map(|p| p.0).collect(),
        bits: pairs.iter().map(|p| p.1).collect(),
    })
}
