//! Validation of one serial sample against the plan, before any tensor is touched.
//!
//! Yields the run-time lengths and the ownership data the layout needs.

use std::collections::BTreeMap;

use featshard_spec::ir::Role;
use featshard_spec::plan::{FeaturePlan, Ownership, Padding, Plan, TensorPlan};
use tch::{Kind, Tensor};

use crate::error::{RuntimeError, TorchContext};
use crate::intake::Intake;
use crate::kind::{kind_name, kind_of};
use crate::par::try_map;

/// One sample: feature name -> tensor.
pub type Features = BTreeMap<String, Tensor>;

pub use featshard_exec::Options;

/// Other handles on the same tensors, for another thread.
pub(crate) fn handles(features: &Features) -> Features {
    features
        .iter()
        .map(|(n, x)| (n.clone(), x.shallow_clone()))
        .collect()
}

/// A sample that passed validation.
#[derive(Debug)]
pub struct Checked {
    /// Tensor features to lay out, sorted.
    pub names: Vec<String>,
    /// Features carried along untouched, sorted.
    pub passthrough: Vec<String>,
    pub sizes: BTreeMap<String, usize>,
    pub owners: BTreeMap<String, Ownership>,
}

/// Checks a sample after [`intake`](crate::intake::intake): ranks, dtypes, channel
/// sizes, equal lengths per semantic, ownership data and index ranges.
pub fn check(plan: &Plan, taken: &Intake, opts: &Options) -> Result<Checked, RuntimeError> {
    let features = &taken.features;
    let passthrough = taken.passthrough.clone();
    let names: Vec<String> = features
        .keys()
        .filter(|n| !passthrough.contains(n))
        .cloned()
        .collect();
    let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
    let mut first: BTreeMap<String, String> = BTreeMap::new();
    for name in &names {
        let t = tensor_plan(plan, name)?;
        let x = &features[name];
        let shape = x.size();
        if shape.len() != t.axes.len() {
            return Err(RuntimeError::Rank {
                feature: name.clone(),
                expected: t.axes.len(),
                got: shape,
            });
        }
        if x.kind() != kind_of(t.dtype) {
            return Err(RuntimeError::DType {
                feature: name.clone(),
                expected: t.dtype.name().to_owned(),
                got: kind_name(x.kind()),
            });
        }
        for (axis, (a, &n)) in t.axes.iter().zip(&shape).enumerate() {
            match (&a.semantic, a.size) {
                (None, Some(size)) => {
                    if u64::try_from(n).ok() != Some(size) {
                        return Err(RuntimeError::ChannelSize {
                            feature: name.clone(),
                            axis,
                            expected: size,
                            got: n,
                        });
                    }
                }
                (Some(s), _) => {
                    let n_usize = usize::try_from(n).unwrap_or(0);
                    match sizes.get(s) {
                        Some(&expected) if expected != n_usize => {
                            return Err(RuntimeError::Length {
                                feature: name.clone(),
                                axis,
                                semantic: s.clone(),
                                got: n,
                                expected,
                                first: first[s].clone(),
                            })
                        }
                        Some(_) => {}
                        None => {
                            sizes.insert(s.clone(), n_usize);
                            first.insert(s.clone(), name.clone());
                        }
                    }
                }
                (None, None) => {}
            }
        }
    }

    let owners = ownership(plan, features, &sizes)?;
    try_map(
        &names,
        opts.threads,
        || handles(features),
        |features, name| {
            check_index(plan, name, &features[name], &sizes)?;
            check_mask(plan, name, &features[name])
        },
    )?;
    Ok(Checked {
        names,
        passthrough,
        sizes,
        owners,
    })
}

/// The tensor plan of a feature; metadata and unknown names are `Missing`.
pub fn tensor_plan<'p>(plan: &'p Plan, name: &str) -> Result<&'p TensorPlan, RuntimeError> {
    match plan.features.get(name) {
        Some(FeaturePlan::Tensor(t)) => Ok(t),
        _ => Err(RuntimeError::Missing {
            feature: name.to_owned(),
        }),
    }
}

/// Reads a small integer tensor into a vector.
pub(crate) fn to_vec_i64(x: &Tensor, name: &str) -> Result<Vec<i64>, RuntimeError> {
    let flat = x
        .f_to_kind(Kind::Int64)
        .feature(name)?
        .f_flatten(0, -1)
        .feature(name)?;
    Vec::<i64>::try_from(&flat).feature(name)
}

fn ownership(
    plan: &Plan,
    features: &Features,
    sizes: &BTreeMap<String, usize>,
) -> Result<BTreeMap<String, Ownership>, RuntimeError> {
    let mut owners = BTreeMap::new();
    for (sem, s) in &plan.semantics {
        let Padding::OwnerBlocks { owner, source, .. } = &s.padding else {
            continue;
        };
        let Some(&len) = sizes.get(sem) else { continue };
        let owner_len = sizes.get(owner).copied().unwrap_or(0);
        let counts = source.counts().filter(|c| features.contains_key(*c));
        let map = source.map().filter(|m| features.contains_key(*m));
        let ownership = match (counts, map) {
            (Some(c), map) => {
                let counts = owner_counts(c, &features[c], sem, owner, len)?;
                if let Some(m) = map {
                    check_map_counts(m, &features[m], c, &counts, sem, owner)?;
                }
                Ownership::Counts(counts)
            }
            (None, Some(m)) => {
                Ownership::Owners(map_owners(m, &features[m], sem, owner, owner_len)?)
            }
            (None, None) => {
                return Err(RuntimeError::Missing {
                    feature: source.feature().to_owned(),
                })
            }
        };
        owners.insert(sem.clone(), ownership);
    }
    Ok(owners)
}

fn owner_counts(
    fname: &str,
    x: &Tensor,
    sem: &str,
    owner: &str,
    len: usize,
) -> Result<Vec<usize>, RuntimeError> {
    let counts = to_vec_i64(x, fname)?;
    let bad = |message: String| RuntimeError::Ownership {
        feature: fname.to_owned(),
        axis: 0,
        semantic: owner.to_owned(),
        message,
    };
    if let Some(c) = counts.iter().find(|&&c| c < 0) {
        return Err(bad(format!("negative count {c} of `{sem}`")));
    }
    let sum: i64 = counts.iter().sum();
    if usize::try_from(sum).ok() != Some(len) {
        return Err(bad(format!(
            "counts of `{sem}` sum to {sum}, but the sample has {len} {sem}"
        )));
    }
    Ok(counts.into_iter().map(|c| c as usize).collect())
}

/// The owner of every row of a one-hot `[items, owner]` map.
fn map_owners(
    fname: &str,
    x: &Tensor,
    sem: &str,
    owner: &str,
    owner_len: usize,
) -> Result<Vec<usize>, RuntimeError> {
    let rows = x.f_sum_dim_intlist(1, false, Kind::Int64).feature(fname)?;
    let rows = to_vec_i64(&rows, fname)?;
    if let Some((r, n)) = rows.iter().enumerate().find(|(_, &n)| n != 1) {
        return Err(RuntimeError::Ownership {
            feature: fname.to_owned(),
            axis: 1,
            semantic: owner.to_owned(),
            message: format!("row {r} of `{sem}` must have exactly one owner, has {n}"),
        });
    }
    let of = if rows.is_empty() || owner_len == 0 {
        Vec::new()
    } else {
        to_vec_i64(&x.f_argmax(1, false).feature(fname)?, fname)?
    };
    Ok(of.into_iter().map(|o| o as usize).collect())
}

/// Owner counts and an owner map given together must say the same, in owner order:
/// every item's entry at its owner by the counts is 1. One gather, not a pass over the
/// map; that no row holds a second 1 is the one-hot check every index map gets.
fn check_map_counts(
    mname: &str,
    x: &Tensor,
    cname: &str,
    counts: &[usize],
    sem: &str,
    owner: &str,
) -> Result<(), RuntimeError> {
    let by_counts: Vec<i64> = counts
        .iter()
        .enumerate()
        .flat_map(|(o, &c)| std::iter::repeat_n(o as i64, c))
        .collect();
    if by_counts.is_empty() {
        return Ok(());
    }
    let at = Tensor::from_slice(&by_counts).view([-1, 1]);
    let hits = x.f_gather(1, &at, false).feature(mname)?;
    let hits = to_vec_i64(&hits, mname)?;
    let Some(item) = hits.iter().position(|&h| h != 1) else {
        return Ok(());
    };
    let row = x.f_get(item as i64).feature(mname)?;
    let got = to_vec_i64(&row, mname)?
        .iter()
        .position(|&v| v != 0)
        .map_or("no".to_owned(), |o| o.to_string());
    Err(RuntimeError::Ownership {
        feature: mname.to_owned(),
        axis: 1,
        semantic: owner.to_owned(),
        message: format!(
            "`{sem}` item {item} belongs to `{owner}` {got} here, but to {} by `{cname}`",
            by_counts[item]
        ),
    })
}

/// A mask's values are 0 or 1: `false`/`true`, integers 0 and 1, floats 0.0 and 1.0
/// (NaN is neither).
fn check_mask(plan: &Plan, name: &str, x: &Tensor) -> Result<(), RuntimeError> {
    let t = tensor_plan(plan, name)?;
    if !matches!(t.role, Role::Mask { .. }) || x.kind() == Kind::Bool || x.numel() == 0 {
        return Ok(());
    }
    let bad = x
        .f_ne(0)
        .and_then(|nz| nz.f_logical_and(&x.f_ne(1)?))
        .feature(name)?;
    let found = bad
        .f_any()
        .and_then(|b| b.f_int64_value(&[]))
        .feature(name)?
        != 0;
    if !found {
        return Ok(());
    }
    let at = bad
        .f_flatten(0, -1)
        .and_then(|b| b.f_nonzero())
        .and_then(|i| i.f_int64_value(&[0, 0]))
        .feature(name)?;
    let value = x
        .f_flatten(0, -1)
        .and_then(|f| f.f_double_value(&[at]))
        .feature(name)?;
    Err(RuntimeError::MaskValue {
        feature: name.to_owned(),
        index: at,
        value,
    })
}

fn check_index(
    plan: &Plan,
    name: &str,
    x: &Tensor,
    sizes: &BTreeMap<String, usize>,
) -> Result<(), RuntimeError> {
    let t = tensor_plan(plan, name)?;
    let Role::Index(ix) = &t.role else {
        return Ok(());
    };
    if x.numel() == 0 {
        return Ok(());
    }
    match ix.one_hot {
        None => {
            let len = sizes.get(&ix.of).copied().ok_or_else(|| {
                RuntimeError::Plan(featshard_spec::plan::ResolveError::MissingLength {
                    semantic: ix.of.clone(),
                    feature: name.to_owned(),
                    axis: 0,
                })
            })?;
            let (min, max) = x
                .f_aminmax(None::<i64>, false)
                .and_then(|(lo, hi)| Ok((lo.f_int64_value(&[])?, hi.f_int64_value(&[])?)))
                .feature(name)?;
            if min < 0 || usize::try_from(max).map_or(true, |m| m >= len) {
                return Err(RuntimeError::IndexRange {
                    feature: name.to_owned(),
                    semantic: ix.of.clone(),
                    min,
                    max,
                    len,
                });
            }
        }
        Some(axis) => {
            // One reduction pass for both bounds: no temporary the size of the tensor.
            let (lo, hi) = x
                .f_aminmax(None::<i64>, false)
                .and_then(|(lo, hi)| Ok((lo.f_double_value(&[])?, hi.f_double_value(&[])?)))
                .feature(name)?;
            let mut bad_values = lo < 0.0 || hi > 1.0;
            if !bad_values && x.is_floating_point() {
                bad_values = x
                    .f_ne(0)
                    .and_then(|nz| nz.f_logical_and(&x.f_ne(1)?))
                    .and_then(|b| b.f_any())
                    .and_then(|b| b.f_int64_value(&[]))
                    .feature(name)?
                    != 0;
            }
            if bad_values {
                return Err(RuntimeError::OneHot {
                    feature: name.to_owned(),
                    axis,
                    message: "values must be 0 or 1".into(),
                });
            }
            let per_row = x
                .f_sum_dim_intlist(axis as i64, false, Kind::Int64)
                .and_then(|s| s.f_max())
                .and_then(|m| m.f_int64_value(&[]))
                .feature(name)?;
            if per_row > 1 {
                return Err(RuntimeError::OneHot {
                    feature: name.to_owned(),
                    axis,
                    message: format!(
                        "a row points at {per_row} items; one-hot rows hold at most one 1"
                    ),
                });
            }
        }
    }
    Ok(())
}
