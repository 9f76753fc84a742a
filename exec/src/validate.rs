//! Validation of one serial sample against the plan, after intake: ranks, dtypes,
//! channel sizes, equal lengths per semantic, ownership data, index ranges and masks.
//! Yields the run-time lengths and the ownership data the layout needs.

use std::collections::BTreeMap;

use featshard_spec::ir::DType;
use featshard_spec::ir::Role;
use featshard_spec::layout::count_total;
use featshard_spec::plan::{OwnedBy, Ownership, Plan, ResolveError};
use featshard_spec::Mesh;

use crate::array::Array;
use crate::compact::{
    check_map_rows, check_range, given_as_indices, given_narrow, indices, indices_given,
    narrow_hint, OneHot,
};
use crate::error::ExecError;
use crate::feature::{owner_map, tensor_plan, to_i64, two_d};
use crate::files::Sample;
use crate::intake::Intake;
use crate::par;

/// A sample that passed validation.
#[derive(Debug)]
pub struct Checked {
    /// Tensor features to lay out, sorted.
    pub names: Vec<String>,
    /// Features carried along untouched, sorted.
    pub passthrough: Vec<String>,
    /// The length of every semantic present.
    pub sizes: BTreeMap<String, usize>,
    /// The ownership data of every owner-partitioned semantic present.
    pub owners: BTreeMap<String, Ownership>,
    /// Every one-hot feature's indices (see [`crate::compact`]), made by the pass that
    /// checks it.
    pub compact: BTreeMap<String, Array<'static>>,
}

/// Checks a sample after [`intake`](crate::intake::intake) (see the module
/// documentation).
pub fn check(plan: &Plan, taken: &Intake) -> Result<Checked, ExecError> {
    let features = &taken.features;
    let passthrough = taken.passthrough.clone();
    let mut names: Vec<String> = features
        .keys()
        .filter(|n| !passthrough.contains(n))
        .cloned()
        .collect();
    // The sample's own features set each length, derived ones (made from those lengths)
    // after: a length that disagrees is told against a feature the sample gave.
    names.sort_by_key(|n| plan.tensor(n).is_some_and(|t| t.derived.is_some()));
    let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
    let mut first: BTreeMap<String, String> = BTreeMap::new();
    for name in &names {
        let x = &features[name];
        let (dtype, shape) = declared(plan, name, x.dtype(), x.shape())?;
        check_shape(plan, name, dtype, &shape, &mut sizes, &mut first)?;
    }
    let owners = ownership(plan, features, &sizes)?;
    let mut compact = BTreeMap::new();
    for (name, made) in names
        .iter()
        .zip(check_values_on(plan, taken, &names, &sizes))
    {
        compact.extend(made?.map(|m| (name.clone(), m)));
    }
    Ok(Checked {
        names,
        passthrough,
        sizes,
        owners,
        compact,
    })
}

/// [`check_values`] of every feature in `names`, on up to `taken.threads` threads (the
/// largest features dealt first), in the order of `names`: the first error in that
/// order is the one reported, whatever the threads.
fn check_values_on(
    plan: &Plan,
    taken: &Intake,
    names: &[String],
    sizes: &BTreeMap<String, usize>,
) -> Vec<Result<Option<Array<'static>>, ExecError>> {
    let features = &taken.features;
    let bytes =
        |k: usize| features[&names[k]].numel() * crate::dtype::size(features[&names[k]].dtype());
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by_key(|&k| std::cmp::Reverse(bytes(k)));
    let mut done = par::map(
        &order,
        taken.threads,
        || (),
        |_, &k| {
            (
                k,
                check_values(plan, &names[k], &features[&names[k]], sizes),
            )
        },
    );
    done.sort_by_key(|(k, _)| *k);
    done.into_iter().map(|(_, r)| r).collect()
}

/// The checks of one feature that read its values: index ranges, masks 0 or 1, the
/// declared range, one-hot rows. Returns a one-hot feature's indices (a one-hot map's
/// compact form needs the layout: `place` makes it).
fn check_values(
    plan: &Plan,
    name: &str,
    x: &Array,
    sizes: &BTreeMap<String, usize>,
) -> Result<Option<Array<'static>>, ExecError> {
    check_index(plan, name, x, sizes)?;
    check_mask(plan, name, x)?;
    check_bool(name, x)?;
    let t = tensor_plan(plan, name)?;
    if let Some(range) = t.range {
        check_range(name, x, range)?;
    }
    let Some(oh) = OneHot::of(t, &[]).filter(|o| !o.map) else {
        return Ok(None);
    };
    if given_as_indices(t, x.dtype(), &x.shape()) {
        indices_given(name, x, &oh).map(Some)
    } else {
        indices(name, x, &oh).map(Some)
    }
}

/// The checks of [`check`] that need no values, on the dtype and shape of every tensor
/// feature the plan places (a file's header, or a sample known by its lengths): every
/// one present, rank, dtype, channel sizes, one length per semantic. Returns the
/// semantics' lengths.
pub fn check_shapes(
    plan: &Plan,
    shapes: &BTreeMap<String, (DType, Vec<usize>)>,
) -> Result<BTreeMap<String, usize>, ExecError> {
    let (mut sizes, mut first) = (BTreeMap::new(), BTreeMap::new());
    // A domain model's parameters and outputs are the model's, never in a sample.
    for (name, _) in plan.tensors().filter(|(_, t)| !t.parameter && !t.output) {
        let (dtype, shape) = shapes.get(name).ok_or_else(|| ExecError::Missing {
            feature: name.to_owned(),
        })?;
        let (dtype, shape) = declared(plan, name, *dtype, shape.clone())?;
        check_shape(plan, name, dtype, &shape, &mut sizes, &mut first)?;
    }
    Ok(sizes)
}

/// The dtype and shape of every sample input of a sample known by its semantics'
/// lengths alone (a reader's, before any value is read): each axis its semantic's
/// length, or its channel size. Refused by name: a semantic an input needs that
/// `lengths` lacks, and a length `lengths` gives for no semantic of the spec.
/// [`check_shapes`] then checks them as any sample's.
pub fn shapes_of_lengths(
    plan: &Plan,
    lengths: &BTreeMap<String, usize>,
) -> Result<BTreeMap<String, (DType, Vec<usize>)>, ExecError> {
    if let Some(s) = lengths.keys().find(|s| !plan.semantics.contains_key(*s)) {
        return Err(ExecError::Blocks {
            feature: "*".into(),
            message: format!("a length is given for `{s}`, which is no semantic of the spec"),
        });
    }
    let mut out = BTreeMap::new();
    for (name, t) in plan.tensors().filter(|(_, t)| !t.parameter && !t.output) {
        let mut shape = Vec::with_capacity(t.axes.len());
        for (axis, a) in t.axes.iter().enumerate() {
            let len = match (&a.semantic, a.size) {
                (Some(s), _) => lengths.get(s).copied().ok_or_else(|| ExecError::Blocks {
                    feature: name.to_owned(),
                    message: format!("axis {axis}: no length given for its semantic `{s}`"),
                })?,
                (None, size) => usize::try_from(size.unwrap_or(0)).unwrap_or(usize::MAX),
            };
            shape.push(len);
        }
        out.insert(name.to_owned(), (t.dtype, shape));
    }
    Ok(out)
}

/// The checks of a domain model's parameter `name` (declared `parameter: true`), given
/// as `dtype` and `shape`, before it is sharded over the domain mesh `mesh`: rank,
/// dtype, channel sizes, and every split axis at least as long as its ranks.
pub fn check_parameter(
    plan: &Plan,
    name: &str,
    dtype: DType,
    shape: &[usize],
    mesh: Mesh,
) -> Result<(), ExecError> {
    let t = tensor_plan(plan, name)?;
    check_shape(
        plan,
        name,
        dtype,
        shape,
        &mut BTreeMap::new(),
        &mut BTreeMap::new(),
    )?;
    for (axis, (a, &len)) in t.axes.iter().zip(shape).enumerate() {
        let Some(m) = a.split.mesh_axis() else {
            continue;
        };
        let ranks = mesh.size(m);
        if len < ranks {
            return Err(ExecError::Plan(ResolveError::EmptyShard {
                feature: name.to_owned(),
                axis,
                semantic: a.semantic.clone().unwrap_or_default(),
                len,
                ranks,
                mesh_axis: plan.mesh.axes().get(m).cloned().unwrap_or_default(),
            }));
        }
    }
    Ok(())
}

/// The dtype and shape a feature given as `dtype` and `shape` stands for: a one-hot
/// feature given as its indices stands for its dense form (the class axis put back), a
/// feature given narrower (`given_narrow`) for its declared dtype.
fn declared(
    plan: &Plan,
    name: &str,
    dtype: DType,
    mut shape: Vec<usize>,
) -> Result<(DType, Vec<usize>), ExecError> {
    let t = tensor_plan(plan, name)?;
    if given_narrow(t, dtype) {
        return Ok((t.dtype, shape));
    }
    if !given_as_indices(t, dtype, &shape) {
        return Ok((dtype, shape));
    }
    let classes = t.axes.last().and_then(|a| a.size).unwrap_or(0);
    shape.push(usize::try_from(classes).unwrap_or(usize::MAX));
    Ok((t.dtype, shape))
}

/// Rank, dtype, channel sizes, and the length of each semantic (the first feature
/// with it sets it).
fn check_shape(
    plan: &Plan,
    name: &str,
    dtype: DType,
    shape: &[usize],
    sizes: &mut BTreeMap<String, usize>,
    first: &mut BTreeMap<String, String>,
) -> Result<(), ExecError> {
    let t = tensor_plan(plan, name)?;
    if shape.len() != t.axes.len() {
        return Err(ExecError::Rank {
            feature: name.to_owned(),
            expected: t.axes.len(),
            got: shape.iter().map(|&d| d as i64).collect(),
        });
    }
    if dtype != t.dtype {
        return Err(ExecError::DType {
            feature: name.to_owned(),
            expected: format!("{}{}", t.dtype.name(), narrow_hint(t)),
            got: dtype.name().to_owned(),
        });
    }
    for (axis, (a, &n)) in t.axes.iter().zip(shape).enumerate() {
        match (&a.semantic, a.size) {
            (None, Some(size)) if n as u64 != size => {
                return Err(ExecError::ChannelSize {
                    feature: name.to_owned(),
                    axis,
                    expected: size,
                    got: n as i64,
                });
            }
            (Some(s), _) if n != 1 && plan.semantics.get(s).is_some_and(|p| p.batch) => {
                return Err(ExecError::BatchSize {
                    feature: name.to_owned(),
                    axis,
                    semantic: s.clone(),
                    got: n,
                });
            }
            (Some(s), _) => match sizes.get(s) {
                Some(&expected) if expected != n => {
                    return Err(ExecError::Length {
                        feature: name.to_owned(),
                        axis,
                        semantic: s.clone(),
                        got: n as i64,
                        expected,
                        first: first[s].clone(),
                    })
                }
                Some(_) => {}
                None => {
                    sizes.insert(s.clone(), n);
                    first.insert(s.clone(), name.to_owned());
                }
            },
            _ => {}
        }
    }
    Ok(())
}

fn ownership(
    plan: &Plan,
    features: &Sample,
    sizes: &BTreeMap<String, usize>,
) -> Result<BTreeMap<String, Ownership>, ExecError> {
    let mut owners = BTreeMap::new();
    for (sem, s) in &plan.semantics {
        let Some(OwnedBy { owner, source, .. }) = &s.owned_by else {
            continue;
        };
        let Some(&len) = sizes.get(sem) else { continue };
        let owner_len = sizes.get(owner).copied().unwrap_or(0);
        let counts = source.counts().filter(|c| features.contains_key(*c));
        let map = source.map().filter(|m| features.contains_key(*m));
        let map = match map {
            Some(m) => Some((m, owner_map(plan, m, &features[m], owner, owner_len)?)),
            None => None,
        };
        let ownership = match (counts, map) {
            (Some(c), map) => {
                let counts = owner_counts(c, &features[c], sem, owner, len)?;
                if let Some((m, x)) = map {
                    // An id vector's one axis is its items'; a one-hot map's owner axis is 1.
                    let ids = plan.tensor(m).is_some_and(|t| t.axes.len() == 1);
                    let at = match ids {
                        true => (0, sem.as_str()),
                        false => (1, owner.as_str()),
                    };
                    check_map_counts(m, &x, c, &counts, (sem, owner), at)?;
                }
                Ownership::Counts(counts)
            }
            (None, Some((m, x))) => {
                Ownership::Owners(map_owners(plan, m, &x, sem, owner, owner_len)?)
            }
            (None, None) => {
                return Err(ExecError::Missing {
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
    x: &Array,
    sem: &str,
    owner: &str,
    len: usize,
) -> Result<Vec<usize>, ExecError> {
    let counts = to_i64(x);
    let bad = |message: String| ExecError::Ownership {
        feature: fname.to_owned(),
        axis: 0,
        semantic: owner.to_owned(),
        message,
    };
    if let Some(c) = counts.iter().find(|&&c| c < 0) {
        return Err(bad(format!("negative count {c} of `{sem}`")));
    }
    let sum =
        count_total(counts.iter().copied()).map_err(|e| bad(format!("counts of `{sem}`: {e}")))?;
    if sum != len {
        return Err(bad(format!(
            "counts of `{sem}` sum to {sum}, but the sample has {len} {sem}"
        )));
    }
    Ok(counts.into_iter().map(|c| c as usize).collect())
}

/// The owner of every row of a one-hot `[items, owner]` map.
fn map_owners(
    plan: &Plan,
    fname: &str,
    x: &Array,
    sem: &str,
    owner: &str,
    owner_len: usize,
) -> Result<Vec<usize>, ExecError> {
    two_d(plan, fname, x)?;
    let mut of = Vec::with_capacity(x.shape()[0]);
    let mut bad = None;
    let _ = x.for_each_row_nonzero(|idx, nz| {
        let n: f64 = nz.iter().map(|&(_, v)| v).sum();
        if n != 1.0 {
            bad = Some((idx[0], n as i64));
            return Err(());
        }
        // The first maximum, as argmax takes it: a row summing to 1 has one above 0.
        let best = nz
            .iter()
            .fold((0, f64::MIN), |b, &(j, v)| if v > b.1 { (j, v) } else { b });
        of.push(best.0);
        Ok(())
    });
    if let Some((r, n)) = bad {
        // An id vector (one id per item) has its items' axis only.
        let ids = plan.tensor(fname).is_some_and(|t| t.axes.len() == 1);
        return Err(match ids {
            true => ExecError::Ownership {
                feature: fname.to_owned(),
                axis: 0,
                semantic: sem.to_owned(),
                message: format!(
                    "item {r} of `{sem}` has no owner in `{owner}` (its id is the none value): declare `unowned_rows: pad` on `{sem}` to drop such items as pads"
                ),
            },
            false => ExecError::Ownership {
                feature: fname.to_owned(),
                axis: 1,
                semantic: owner.to_owned(),
                message: format!("row {r} of `{sem}` must have exactly one owner, has {n}"),
            },
        });
    }
    if owner_len == 0 {
        of.clear();
    }
    Ok(of)
}

/// Owner counts and an owner map given together must say the same, in owner order:
/// every item's entry at its owner by the counts is 1. One read per item, not a pass
/// over the map; that no row holds a second 1 is the one-hot check every index map gets.
fn check_map_counts(
    mname: &str,
    x: &Array,
    cname: &str,
    counts: &[usize],
    (sem, owner): (&str, &str),
    (axis, axis_semantic): (usize, &str),
) -> Result<(), ExecError> {
    let by_counts: Vec<usize> = counts
        .iter()
        .enumerate()
        .flat_map(|(o, &c)| std::iter::repeat_n(o, c))
        .collect();
    let shape = x.shape();
    let bad = |message: String| ExecError::Ownership {
        feature: mname.to_owned(),
        axis,
        semantic: axis_semantic.to_owned(),
        message,
    };
    if by_counts.is_empty() {
        return Ok(());
    }
    if shape.len() != 2 || shape[0] != by_counts.len() {
        return Err(bad(format!(
            "shape {shape:?} does not fit {} `{sem}` counted by `{cname}`",
            by_counts.len()
        )));
    }
    // Each row's one 1 must be in its owner's column. The map's nonzero entries are
    // read once and kept (the one-hot check reads them too); a map given as its
    // indices has nothing else.
    let mut found = None;
    let mut i = 0;
    let _ = x.for_each_row_nonzero(|_, nz| {
        let owned = matches!(nz, [(o, v)] if *o == by_counts[i] && *v == 1.0);
        if !owned {
            found = Some((i, nz.first().map(|e| e.0)));
            return Err(());
        }
        i += 1;
        Ok(())
    });
    let Some((item, got)) = found else {
        return Ok(());
    };
    let got = got.map_or("no".to_owned(), |o| o.to_string());
    Err(bad(format!(
        "`{sem}` item {item} belongs to `{owner}` {got} here, but to {} by `{cname}`",
        by_counts[item]
    )))
}

/// A mask's values are 0 or 1: `false`/`true` (bytes 0 and 1: a bool byte of 2 is
/// neither, though torch reads it as true), integers 0 and 1, floats 0.0 and 1.0 (NaN
/// is neither).
fn check_mask(plan: &Plan, name: &str, x: &Array) -> Result<(), ExecError> {
    let t = tensor_plan(plan, name)?;
    if !matches!(t.role, Role::Mask { .. }) {
        return Ok(());
    }
    let found = x.first_outside([0.0, 1.0]).map(|(i, v)| (i as i64, v));
    match found {
        None => Ok(()),
        Some((index, value)) => Err(ExecError::MaskValue {
            feature: name.to_owned(),
            index,
            value,
        }),
    }
}

/// A `bool` feature's bytes are 0 or 1 (torch reads any other byte as true, so a
/// block holding one would not come back as written). Masks are checked as masks, and
/// a feature given as its elements had its values checked as they were read.
fn check_bool(name: &str, x: &Array) -> Result<(), ExecError> {
    if x.dtype() != DType::Bool || x.entry_list().is_some() || x.is_rows_only() {
        return Ok(());
    }
    match x.first_outside([0.0, 1.0]) {
        None => Ok(()),
        Some((index, _)) => Err(ExecError::Entries {
            feature: name.to_owned(),
            message: format!(
                "a bool holds byte 0 (false) or 1 (true), found byte {} at flat index {index}",
                bool_byte(x, index)
            ),
        }),
    }
}

/// The byte of a `bool` array at flat (row-major) `index`.
fn bool_byte(x: &Array, index: usize) -> u8 {
    x.contiguous().base_bytes().get(index).copied().unwrap_or(0)
}

fn check_index(
    plan: &Plan,
    name: &str,
    x: &Array,
    sizes: &BTreeMap<String, usize>,
) -> Result<(), ExecError> {
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
                ExecError::Plan(ResolveError::MissingLength {
                    semantic: ix.of.clone(),
                    feature: name.to_owned(),
                    axis: 0,
                })
            })?;
            let (mut min, mut max) = (i64::MAX, i64::MIN);
            let _ = x.for_each_row(|_, row| {
                // The none value names no item: it is never out of range.
                for v in row
                    .iter()
                    .map(|&v| v as i64)
                    .filter(|&v| Some(v) != ix.none)
                {
                    (min, max) = (min.min(v), max.max(v));
                }
                Ok::<(), ()>(())
            });
            if min == i64::MAX {
                return Ok(());
            }
            if min < 0 || usize::try_from(max).map_or(true, |m| m >= len) {
                return Err(ExecError::IndexRange {
                    feature: name.to_owned(),
                    semantic: ix.of.clone(),
                    min,
                    max,
                    len,
                    none: ix.none,
                });
            }
            Ok(())
        }
        Some(axis) => check_map_rows(name, x, axis),
    }
}
