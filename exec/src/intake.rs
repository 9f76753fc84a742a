//! Intake: a sample as the featurizer emitted it, made into the sample the plan lays
//! out. Nothing here decides geometry; it executes what the plan declares:
//!
//! 1. keys: features kept, `drop` keys and (by the `other_keys` policy) other keys
//!    removed or passed through, the rest refused all at once; optional features may
//!    be absent;
//! 2. incoming pads: every axis of a semantic that arrives padded is cut to its real
//!    items (a prefix, told by a mask or by owner counts); one-hot maps may not point
//!    into the cut;
//! 3. unowned rows: owner-map rows with no owner are dropped where the plan says they
//!    are pads;
//! 4. derived features: made from their inputs, or checked against them when given.
//!
//! Cuts and drops select items of views; nothing large is copied.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use featshard_spec::ir::{DeriveRule, GivenForm, IncomingSource, KeyPolicy, Role};
use featshard_spec::plan::{FeaturePlan, OwnedBy, Plan, TensorPlan};

use crate::array::Array;
use crate::compact::{
    entries_from_pairs, given_as_indices, map_given_as_indices, INDICES, SHAPE, VALUES,
};
use crate::dtype;
use crate::error::ExecError;
use crate::feature::{axis_length, id_rows, owner_map, row_sums, tensor_plan, to_i64};
use crate::files::Sample;
use featshard_spec::layout::count_total;
use featshard_spec::limits;

/// What to process, what to let through, and with how many threads.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Only the features of this workflow (all features of the spec for `None`).
    pub workflow: Option<String>,
    /// Features not in the spec (or workflow) that are carried along untouched
    /// instead of being an error.
    pub passthrough: BTreeSet<String>,
    /// Threads that writing rank files and blocks may use (0 and 1: the calling thread
    /// only). Validation reads each large feature once, on the calling thread.
    pub threads: usize,
}

/// A sample after intake.
#[derive(Debug)]
pub struct Intake<'a> {
    /// Tensor features to lay out (real items only, derived ones added) and the
    /// features carried along untouched.
    pub features: Sample<'a>,
    /// Names in `features` carried along untouched, sorted.
    pub passthrough: Vec<String>,
    /// Sample keys removed (`drop` or the `other_keys: drop` policy), sorted.
    pub dropped: Vec<String>,
    /// Semantics whose axes arrived longer than their real items: the arrived length.
    pub arrived: BTreeMap<String, usize>,
    /// Owner-map rows without an owner dropped as pads, per semantic.
    pub unowned: BTreeMap<String, usize>,
    /// Key halos to make beside the blocks (`derive: {halo: ...}` of the workflow).
    pub halos: Vec<String>,
    /// Threads the checks that read every value may use (`Options::threads`).
    pub threads: usize,
}

/// Runs intake on one serial sample (see the module documentation).
pub fn intake<'a>(
    plan: &Plan,
    features: &Sample<'a>,
    opts: &Options,
) -> Result<Intake<'a>, ExecError> {
    if plan.mesh.is_domain() {
        return Err(ExecError::Unsupported {
            message: format!(
                "`{}` is a domain-parallel (ShardTensor) plan: its generated Python module scatters it; this runtime shards CP (DTensor) plans",
                plan.module
            ),
        });
    }
    intake_any(plan, features, opts)
}

/// [`intake`] of a CP or a domain-parallel plan (whose blocks only
/// [`crate::place::place_domain`] places).
pub(crate) fn intake_any<'a>(
    plan: &Plan,
    features: &Sample<'a>,
    opts: &Options,
) -> Result<Intake<'a>, ExecError> {
    let named;
    let features = match plan.inputs.separator.as_str() {
        featshard_spec::names::PATH => features,
        _ => {
            named = by_name(plan, features)?;
            &named
        }
    };
    let delivered;
    let features = match given_one_hot_maps(plan, features)? {
        Some(d) => {
            delivered = d;
            &delivered
        }
        None => features,
    };
    check_lengths(plan, features)?;
    check_given_indices(plan, features)?;
    check_passthrough(plan, opts)?;
    let features = &entries_from_pairs(plan, features)?;
    let (mut kept, passthrough, dropped) = sort_keys(plan, features, opts)?;
    maps_from_indices(plan, &mut kept)?;
    let real = real_lengths(plan, &kept)?;
    for (sem, &n) in &real {
        check_cut_items_unowned(plan, &kept, sem, n)?;
    }
    let mut arrived = BTreeMap::new();
    for (sem, &n) in &real {
        if let Some(len) = cut_to_real(plan, &mut kept, sem, n)? {
            arrived.insert(sem.clone(), len);
        }
    }
    let unowned = drop_unowned_rows(plan, &mut kept)?;
    let halos = derive(plan, &mut kept, opts)?;
    for name in &passthrough {
        kept.insert(name.clone(), features[name].clone());
    }
    Ok(Intake {
        features: kept,
        passthrough,
        dropped,
        arrived,
        unowned,
        halos,
        threads: opts.threads.max(1),
    })
}

/// One-hot maps the spec delivers as ids, given dense, read as their ids (the form they
/// are laid out in); each as wide as the other features say its items' semantic is.
/// `None` when the sample has none.
fn given_one_hot_maps<'a>(
    plan: &Plan,
    features: &Sample<'a>,
) -> Result<Option<Sample<'a>>, ExecError> {
    let given: Vec<&String> = features
        .iter()
        .filter(|(n, x)| {
            plan.tensor(n)
                .is_some_and(|t| matches!(t.given, Some(GivenForm::OneHot { .. })) && x.dim() == 2)
        })
        .map(|(n, _)| n)
        .collect();
    if given.is_empty() {
        return Ok(None);
    }
    let mut out = features.clone();
    for name in given {
        let x = &features[name];
        if let Some(Role::Index(ix)) = plan.tensor(name).map(|t| &t.role) {
            let width = features
                .iter()
                .filter(|(n, _)| *n != name)
                .find_map(|(n, y)| axis_length(plan, n, y, &ix.of));
            if let Some(w) = width.filter(|&w| w != x.shape()[1]) {
                return Err(ExecError::OneHot {
                    feature: name.clone(),
                    axis: 1,
                    message: format!(
                        "given as a one-hot map {} `{}` wide; the other features give {w}",
                        x.shape()[1],
                        ix.of
                    ),
                });
            }
        }
        out.insert(name.clone(), crate::deliver::one_hot_to_ids(name, x)?);
    }
    Ok(Some(out))
}

/// A sample file's keys as the spec names them: a nested feature's path joined by the
/// spec's separator (`constraint_feature/contact`) is the spec's path
/// (`constraint_feature.contact`).
/// Two keys naming one feature (`a/b` and `a.b` with `separator: /`) are refused.
fn by_name<'a>(plan: &Plan, features: &Sample<'a>) -> Result<Sample<'a>, ExecError> {
    let mut named = Sample::new();
    let mut key_of: BTreeMap<String, &str> = BTreeMap::new();
    for (k, x) in features {
        let name = plan.inputs.name_of_key(k).into_owned();
        if let Some(first) = key_of.insert(name.clone(), k) {
            return Err(ExecError::Twice {
                feature: name,
                keys: vec![first.to_owned(), k.clone()],
            });
        }
        named.insert(name, x.clone());
    }
    Ok(named)
}

/// A key that is a spec feature's path joined another way than the spec's separator
/// says (`a/b` for `a.b`): the separator to declare.
fn separator_hint(plan: &Plan, unknown: &[String]) -> String {
    for key in unknown {
        for sep in ["/", "__", ":", "-", "|", "."] {
            let name = key.replace(sep, featshard_spec::names::PATH);
            if key.contains(sep)
                && sep != plan.inputs.separator
                && plan.features.contains_key(&name)
            {
                return format!(
                    "; `{key}` is feature `{name}` with its path joined by `{sep}`: declare `separator: \"{sep}\"`"
                );
            }
        }
    }
    String::new()
}

/// Every semantic axis the sample's features give within the length limit, before
/// anything is allocated from a length: a file's header may declare any, and a map
/// given as indices is as wide as another feature says its items' semantic is long.
fn check_lengths(plan: &Plan, features: &Sample) -> Result<(), ExecError> {
    for (name, x) in features {
        let Some(t) = plan.tensor(name) else { continue };
        // Given as declared, or as indices (the one-hot axis, the last, left out).
        for (axis, (a, &n)) in t.axes.iter().zip(&x.shape()).enumerate() {
            if let Some(s) = &a.semantic {
                limits::check_length(s, n).map_err(|message| ExecError::TooLarge {
                    feature: name.clone(),
                    message: format!("axis {axis} ({s}): {message}"),
                })?;
            }
        }
    }
    Ok(())
}

/// One-hot features and maps given with their one-hot axis left out are given as
/// indices, which must be integers: said with the dtype and shape as given (before any
/// incoming pad is cut), not as a wrong rank found later.
fn check_given_indices(plan: &Plan, features: &Sample) -> Result<(), ExecError> {
    for (name, x) in features {
        let Some(t) = plan.tensor(name) else { continue };
        let one_hot = t
            .one_hot
            .filter(|&a| a + 1 == t.axes.len())
            .or(match &t.role {
                Role::Index(ix) => ix.one_hot.filter(|&a| a + 1 == t.axes.len()),
                _ => None,
            });
        if let Some(axis) = one_hot.filter(|_| x.dim() + 1 == t.axes.len()) {
            if !x.dtype().is_integer() {
                return Err(ExecError::OneHot {
                    feature: name.clone(),
                    axis,
                    message: format!(
                        "given as indices (its one-hot axis left out), which are integers; given {} {:?}",
                        x.dtype(),
                        x.shape()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// A sparse feature's element keys (`NAME.indices`, ...) are the feature itself, placed
/// as it: never passed through.
fn check_passthrough(plan: &Plan, opts: &Options) -> Result<(), ExecError> {
    for (name, _) in plan.tensors().filter(|(_, t)| t.sparse) {
        let keys = [INDICES, VALUES, SHAPE].map(|k| format!("{name}{k}"));
        if let Some(key) = keys.iter().find(|k| opts.passthrough.contains(*k)) {
            return Err(ExecError::Entries {
                feature: name.to_owned(),
                message: format!(
                    "`{key}` is this sparse feature given as its elements: it is placed, not passed through (leave it out of the keys passed through)"
                ),
            });
        }
    }
    Ok(())
}

type Sorted<'a> = (Sample<'a>, Vec<String>, Vec<String>);

/// One-hot maps given as their indices become maps known by their rows
/// ([`Array::one_hot_rows`]), as wide as the other features say their items' semantic
/// is: every later check reads them as it reads a dense map, and none is ever made.
fn maps_from_indices(plan: &Plan, kept: &mut Sample) -> Result<(), ExecError> {
    let given: Vec<String> = kept
        .iter()
        .filter(|(n, x)| {
            plan.tensor(n)
                .is_some_and(|t| map_given_as_indices(t, x.dtype(), &x.shape()))
        })
        .map(|(n, _)| n.clone())
        .collect();
    for name in given {
        let t = tensor_plan(plan, &name)?;
        let semantic = t.axes[1].semantic.clone().unwrap_or_default();
        let width = kept
            .iter()
            .filter(|(n, _)| **n != name)
            .find_map(|(n, x)| axis_length(plan, n, x, &semantic))
            .ok_or_else(|| ExecError::OneHot {
                feature: name.clone(),
                axis: 1,
                message: format!(
                    "given as indices, but no other feature gives the length of `{semantic}`"
                ),
            })?;
        // An id vector the spec declared (delivered as this map) has the none it declared.
        let none = match &t.given {
            Some(GivenForm::Ids { none, .. }) => *none,
            _ => Some(-1),
        };
        let rows = id_rows(&kept[&name], width, none).map_err(|(k, v)| ExecError::OneHot {
            feature: name.clone(),
            axis: 1,
            message: format!(
                "given as indices, {v} names no item of the {width} `{semantic}`{} at [{k}]",
                none.map_or(
                    " (declare `none: -1` for a row with none)".to_owned(),
                    |n| format!(" ({n}: none)")
                )
            ),
        })?;
        kept.insert(name, Array::one_hot_rows(t.dtype, &rows, width));
    }
    Ok(())
}

/// The tensor features to lay out, the names passed through, the names dropped.
fn sort_keys<'a>(
    plan: &Plan,
    features: &Sample<'a>,
    opts: &Options,
) -> Result<Sorted<'a>, ExecError> {
    // A domain model's parameters and outputs are the model's, never in a sample.
    let model = |n: &str| matches!(plan.features.get(n), Some(FeaturePlan::Tensor(t)) if t.parameter || t.output);
    let wanted: BTreeSet<&str> = plan
        .feature_names(opts.workflow.as_deref())?
        .into_iter()
        .filter(|n| !model(n))
        .collect();
    let (mut kept, mut passthrough, mut dropped, mut unknown) =
        (Sample::new(), Vec::new(), Vec::new(), Vec::new());
    let mut elsewhere = Vec::new();
    for (name, x) in features {
        match plan.features.get(name) {
            Some(FeaturePlan::Tensor(_)) if wanted.contains(name.as_str()) => {
                kept.insert(name.clone(), x.clone());
            }
            // Metadata passes through untouched.
            Some(FeaturePlan::Metadata { .. }) if wanted.contains(name.as_str()) => {
                passthrough.push(name.clone())
            }
            _ if opts.passthrough.contains(name) => passthrough.push(name.clone()),
            _ if plan.inputs.drop.contains(name) => dropped.push(name.clone()),
            // A feature of another workflow is not this workflow's to place.
            Some(_) => elsewhere.push(name.clone()),
            None => match plan.inputs.other_keys {
                KeyPolicy::Refuse => unknown.push(name.clone()),
                KeyPolicy::Drop => dropped.push(name.clone()),
                KeyPolicy::Pass => passthrough.push(name.clone()),
            },
        }
    }
    if !unknown.is_empty() {
        let hint = separator_hint(plan, &unknown);
        return Err(ExecError::Unknown {
            features: unknown,
            hint,
        });
    }
    if let (false, Some(workflow)) = (elsewhere.is_empty(), &opts.workflow) {
        let features = elsewhere
            .into_iter()
            .map(|n| {
                let ws = plan.workflows.iter().filter(|(_, fs)| fs.contains(&n));
                (n.clone(), ws.map(|(w, _)| w.clone()).collect())
            })
            .collect();
        return Err(ExecError::OtherWorkflow {
            workflow: workflow.clone(),
            features,
        });
    }
    // A key asked to be passed through must be there: a typo would silently drop it.
    if let Some(absent) = opts.passthrough.iter().find(|n| !features.contains_key(*n)) {
        return Err(ExecError::Missing {
            feature: absent.clone(),
        });
    }
    let missing: Vec<String> = wanted
        .iter()
        .filter(|n| {
            plan.tensor(n)
                .is_some_and(|t| !t.optional && t.derived.is_none())
        })
        .filter(|n| !kept.contains_key(**n))
        .map(|n| (*n).to_owned())
        .collect();
    match <[String; 1]>::try_from(missing) {
        Ok([feature]) => Err(ExecError::Missing { feature }),
        Err(features) if !features.is_empty() => Err(ExecError::MissingMany { features }),
        Err(_) => Ok((kept, passthrough, dropped)),
    }
}

/// The number of real items of every semantic that arrives padded (and is present).
fn real_lengths(plan: &Plan, kept: &Sample) -> Result<BTreeMap<String, usize>, ExecError> {
    let mut out = BTreeMap::new();
    for (sem, s) in &plan.semantics {
        let Some(source) = &s.incoming else { continue };
        let fname = source.feature();
        let Some(x) = kept.get(fname) else { continue };
        let n = match source {
            IncomingSource::Mask { .. } => mask_prefix(fname, sem, x)?,
            IncomingSource::Counts { .. } => {
                count_total(to_i64(x)).map_err(|e| ExecError::Ownership {
                    feature: fname.to_owned(),
                    axis: 0,
                    semantic: sem.clone(),
                    message: format!("counts of `{sem}`: {e}"),
                })?
            }
        };
        if let IncomingSource::Mask { .. } = source {
            check_counts_agree(plan, kept, sem, fname, n)?;
        }
        out.insert(sem.clone(), n);
    }
    Ok(out)
}

/// How many leading ones a 1-D incoming-pad mask holds; its values must be 0 or 1,
/// ones first.
fn mask_prefix(fname: &str, sem: &str, x: &Array) -> Result<usize, ExecError> {
    let bad = |message: String| ExecError::Incoming {
        feature: fname.to_owned(),
        axis: 0,
        semantic: sem.to_owned(),
        message,
    };
    if x.dim() != 1 {
        return Err(bad(format!(
            "expected a 1-D mask, got shape {:?}",
            x.shape()
        )));
    }
    let values = x.values();
    if let Some((i, v)) = values
        .iter()
        .enumerate()
        .find(|(_, &v)| v != 0.0 && v != 1.0)
    {
        return Err(bad(format!("mask values are 0 or 1, found {v} at {i}")));
    }
    let n = values.iter().take_while(|&&v| v == 1.0).count();
    if let Some(i) = values[n..].iter().position(|&v| v == 1.0) {
        return Err(bad(format!(
            "the real items must come first: item {} is real after a pad at {n}",
            n + i
        )));
    }
    Ok(n)
}

/// Owner counts given next to an incoming-pad mask must count the same real items.
fn check_counts_agree(
    plan: &Plan,
    kept: &Sample,
    sem: &str,
    mask: &str,
    n: usize,
) -> Result<(), ExecError> {
    let Some(OwnedBy { owner, source, .. }) =
        plan.semantics.get(sem).and_then(|s| s.owned_by.as_ref())
    else {
        return Ok(());
    };
    let Some((cname, counts)) = source.counts().and_then(|c| Some((c, kept.get(c)?))) else {
        return Ok(());
    };
    let bad = |message: String| ExecError::Ownership {
        feature: cname.to_owned(),
        axis: 0,
        semantic: owner.clone(),
        message,
    };
    let sum = count_total(to_i64(counts)).map_err(|e| bad(format!("counts of `{sem}`: {e}")))?;
    if sum != n {
        return Err(bad(format!(
            "counts of `{sem}` sum to {sum}, but `{mask}` marks {n} real {sem}"
        )));
    }
    Ok(())
}

/// Cuts every `sem` axis to its `n` real items; the arrived length if any axis was
/// longer. One-hot maps must have nothing in the cut part of their one-hot axis.
fn cut_to_real(
    plan: &Plan,
    kept: &mut Sample,
    sem: &str,
    n: usize,
) -> Result<Option<usize>, ExecError> {
    let mut arrived = None;
    let reference = arrival_length(plan, kept, sem)?;
    for (name, x) in kept.iter_mut() {
        let t = tensor_plan(plan, name)?;
        for (d, a) in t.axes.iter().enumerate() {
            if a.semantic.as_deref() != Some(sem) || d >= x.dim() {
                continue;
            }
            let len = x.shape()[d];
            // A feature of the wrong rank is left to validation, which names it so; a
            // one-hot feature given as its indices has its axes but the last.
            let declared = x.dim() == t.axes.len() || given_as_indices(t, x.dtype(), &x.shape());
            let reference = reference.as_ref().filter(|_| declared);
            if len < n {
                return Err(ExecError::Incoming {
                    feature: name.clone(),
                    axis: d,
                    semantic: sem.to_owned(),
                    message: format!("length {len}, fewer than the {n} real {sem}"),
                });
            }
            if let Some((by, want)) = reference {
                if len != *want {
                    return Err(ExecError::Incoming {
                        feature: name.clone(),
                        axis: d,
                        semantic: sem.to_owned(),
                        message: format!(
                            "length {len}, but `{by}` arrived with {want} {sem}: every axis of `{sem}` arrives with the same length (its pads at the end), or it would be cut out of line"
                        ),
                    });
                }
            }
            if len == n {
                continue;
            }
            arrived = Some(arrived.map_or(len, |a: usize| a.max(len)));
            check_cut_is_empty(name, t, x, d, n, sem)?;
            *x = x.narrow(d, 0, n);
        }
    }
    Ok(arrived)
}

/// The length every axis of `sem` must arrive with: the incoming mask's (when it has
/// a `sem` axis), else the first feature's with one; with the feature it comes from.
fn arrival_length(
    plan: &Plan,
    kept: &Sample,
    sem: &str,
) -> Result<Option<(String, usize)>, ExecError> {
    let source = plan
        .semantics
        .get(sem)
        .and_then(|s| s.incoming.as_ref())
        .map(|i| i.feature().to_owned());
    let mut first = None;
    for (name, x) in source
        .iter()
        .filter_map(|m| kept.get_key_value(m))
        .chain(kept.iter())
    {
        let t = tensor_plan(plan, name)?;
        let axis = t
            .axes
            .iter()
            .position(|a| a.semantic.as_deref() == Some(sem));
        if let Some(d) = axis.filter(|&d| d < x.dim()) {
            first = Some((name.clone(), x.shape()[d]));
            break;
        }
    }
    Ok(first)
}

/// A one-hot map whose one-hot axis is cut must not point at a cut item.
fn check_cut_is_empty(
    name: &str,
    t: &TensorPlan,
    x: &Array,
    d: usize,
    n: usize,
    sem: &str,
) -> Result<(), ExecError> {
    let Role::Index(ix) = &t.role else {
        return Ok(());
    };
    if ix.one_hot != Some(d) {
        return Ok(());
    }
    let cut = x.narrow(d, n, x.shape()[d] - n);
    let found = cut.for_each_row_nonzero(|_, nz| match nz.is_empty() {
        true => Ok(()),
        false => Err(()),
    });
    if found.is_err() {
        return Err(ExecError::Incoming {
            feature: name.to_owned(),
            axis: d,
            semantic: sem.to_owned(),
            message: format!("a row points at an incoming pad (an item at {n} or later)"),
        });
    }
    Ok(())
}

/// Items cut as incoming pads have no owner: a cut item whose owner-map row names an
/// owner is real (a mask that flags some items, a type flag, is not a pad mask), and
/// cutting it would drop real data. Checked on the map as it arrived, before any cut.
fn check_cut_items_unowned(
    plan: &Plan,
    kept: &Sample,
    sem: &str,
    n: usize,
) -> Result<(), ExecError> {
    let Some(s) = plan.semantics.get(sem) else {
        return Ok(());
    };
    let (Some(OwnedBy { owner, source, .. }), Some(incoming)) = (&s.owned_by, &s.incoming) else {
        return Ok(());
    };
    let Some((map, m)) = source.map().and_then(|m| Some((m, kept.get(m)?))) else {
        return Ok(());
    };
    let width = length_in(plan, owner, kept).unwrap_or(0);
    let m = &owner_map(plan, map, m, owner, width)?;
    let t = tensor_plan(plan, map)?;
    let Role::Index(ix) = &t.role else {
        return Ok(());
    };
    let row_axis =
        (0..m.dim()).find(|&d| Some(d) != ix.one_hot && t.axes[d].semantic.as_deref() == Some(sem));
    let Some(d) = row_axis.filter(|&d| d < m.dim() && m.shape()[d] > n) else {
        return Ok(());
    };
    let mut owned = Vec::new();
    let cut = m.narrow(d, n, m.shape()[d] - n);
    let owner_axis = ix.one_hot.unwrap_or(m.dim() - 1);
    let _ = cut.for_each_row_nonzero(|idx, nz| {
        for &(j, _) in nz {
            let at = |a: usize| if a == idx.len() { j } else { idx[a] };
            owned.push((n + at(d), at(owner_axis)));
        }
        Ok::<(), ()>(())
    });
    // A row holding the map's declared incoming-pad value is a pad (a collator's 0).
    if let Some(pad) = s.incoming_map_pad.filter(|_| ix.one_hot.is_none()) {
        owned.retain(|&(_, j)| j as i64 != pad);
    }
    if owned.is_empty() {
        return Ok(());
    }
    // Every pad naming one owner of an id vector: most likely the featurizer's pad value.
    let same = owned.iter().all(|&(_, j)| j == owned[0].1) && ix.one_hot.is_none();
    let hint = match same {
        true => format!(
            "; if the featurizer pads `{map}` with {} there, declare `incoming_pads: {{mask: {}, map_pad: {}}}`",
            owned[0].1,
            incoming.feature(),
            owned[0].1
        ),
        false => String::new(),
    };
    let shown: Vec<String> = owned
        .iter()
        .take(4)
        .map(|(i, j)| format!("{sem} item {i} to {owner} item {j}"))
        .collect();
    let more = owned.len().saturating_sub(shown.len());
    Err(ExecError::Incoming {
        feature: incoming.feature().to_owned(),
        axis: 0,
        semantic: sem.to_owned(),
        message: format!(
            "cuts {sem} {n} and after as incoming pads, but `{map}` gives {}{}: an incoming pad has no owner, so these items are real (is `{}` a pad mask, or a flag of some real items?){hint}",
            shown.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() },
            incoming.feature()
        ),
    })
}

/// Drops owner-map rows with no owner where the plan says they are pads, on every
/// axis of their semantic.
fn drop_unowned_rows(plan: &Plan, kept: &mut Sample) -> Result<BTreeMap<String, usize>, ExecError> {
    let mut out = BTreeMap::new();
    for (sem, s) in &plan.semantics {
        let Some(OwnedBy { owner, source, .. }) = &s.owned_by else {
            continue;
        };
        let Some(map) = source.map().filter(|_| s.unowned_rows_are_pads) else {
            continue;
        };
        let Some(m) = kept.get(map) else { continue };
        let width = length_in(plan, owner, kept).unwrap_or(0);
        let rows = row_sums(plan, map, &owner_map(plan, map, m, owner, width)?)?;
        let owned: Vec<usize> = (0..rows.len()).filter(|&r| rows[r] != 0.0).collect();
        if owned.len() == rows.len() {
            continue;
        }
        out.insert(sem.clone(), rows.len() - owned.len());
        for (name, x) in kept.iter_mut() {
            let t = tensor_plan(plan, name)?;
            for (d, a) in t.axes.iter().enumerate() {
                if a.semantic.as_deref() == Some(sem.as_str()) && d < x.dim() {
                    *x = x.select(d, &owned);
                }
            }
            renumber(name, t, sem, rows.len(), &owned, x)?;
        }
    }
    Ok(out)
}

/// Ids of `sem`'s items in feature `name` (an index of them, not one-hot) after its
/// rows `owned` of `rows` were kept: each the kept item's new number, the none value
/// as it is; an id of a dropped item is refused by name (what it named is gone).
fn renumber(
    name: &str,
    t: &TensorPlan,
    sem: &str,
    rows: usize,
    owned: &[usize],
    x: &mut Array,
) -> Result<(), ExecError> {
    let Role::Index(ix) = &t.role else {
        return Ok(());
    };
    if ix.of != sem || ix.one_hot.is_some() {
        return Ok(());
    }
    let mut new_id = vec![-1i64; rows];
    for (k, &r) in owned.iter().enumerate() {
        new_id[r] = k as i64;
    }
    let mut bytes = Vec::with_capacity(x.numel() * dtype::size(x.dtype()));
    for v in to_i64(x) {
        let moved = match usize::try_from(v).ok().and_then(|r| new_id.get(r)) {
            _ if Some(v) == ix.none => v,
            Some(&-1) => {
                return Err(ExecError::Entries {
                    feature: name.to_owned(),
                    message: format!(
                        "an index names item {v} of `{sem}`, which has no owner and is dropped as a pad (`unowned_rows: pad`)"
                    ),
                })
            }
            Some(&k) => k,
            // Outside the items: the index check names it.
            None => v,
        };
        dtype::encode_i64(x.dtype(), moved, &mut bytes);
    }
    *x = Array::owned(x.dtype(), x.shape(), bytes);
    Ok(())
}

/// Makes every derived feature of the workflow, or checks the one given; returns the
/// key halos, which are made once the blocks are laid out.
fn derive(plan: &Plan, kept: &mut Sample, opts: &Options) -> Result<Vec<String>, ExecError> {
    let mut halos = Vec::new();
    for name in plan.feature_names(opts.workflow.as_deref())? {
        let Some(t) = plan.tensor(name) else {
            continue;
        };
        let Some(rule) = &t.derived else { continue };
        let made = match rule {
            DeriveRule::Halo { of, .. } => {
                if kept.contains_key(name) {
                    return Err(ExecError::MadeWithBlocks {
                        feature: name.to_owned(),
                        rule: describe(rule),
                    });
                }
                if !kept.contains_key(of) {
                    return Err(ExecError::Missing {
                        feature: of.clone(),
                    });
                }
                halos.push(name.to_owned());
                continue;
            }
            DeriveRule::Outer { of: [a, b] } => match (kept.get(a), kept.get(b)) {
                (Some(x), Some(y)) => outer(x, y, t.dtype),
                _ => {
                    return Err(ExecError::Missing {
                        feature: if kept.contains_key(a) { b } else { a }.clone(),
                    })
                }
            },
            DeriveRule::Valid => valid_mask(plan, name, t, kept)?,
        };
        match kept.get(name) {
            Some(given) => {
                let same = given.shape() == made.shape()
                    && given.dtype() == made.dtype()
                    && equal_values(given, &made);
                if !same {
                    return Err(ExecError::Derived {
                        feature: name.to_owned(),
                        rule: describe(rule),
                    });
                }
            }
            None => {
                kept.insert(name.to_owned(), made);
            }
        }
    }
    Ok(halos)
}

/// A validity mask at the sample's real lengths (after intake's cuts): every element 1.
/// One row of ones is selected for every item of its first axis, so no serial copy of
/// a pair mask is made; pads come from the layout, at the mask's pad 0.
fn valid_mask(
    plan: &Plan,
    name: &str,
    t: &TensorPlan,
    kept: &Sample,
) -> Result<Array<'static>, ExecError> {
    let shape = t
        .axes
        .iter()
        .map(|a| {
            let s = a.semantic.as_deref().unwrap_or_default();
            length_in(plan, s, kept).ok_or_else(|| ExecError::Blocks {
                feature: name.to_owned(),
                message: format!(
                    "no feature of the sample gives the length of `{s}`, which this validity mask covers"
                ),
            })
        })
        .collect::<Result<Vec<usize>, _>>()?;
    let mut one = Vec::new();
    dtype::encode_f64(t.dtype, 1.0, &mut one);
    let Some((&first, rest)) = shape.split_first() else {
        return Ok(Array::owned(t.dtype, Vec::new(), one));
    };
    let mut base = vec![1];
    base.extend(rest);
    let row = one.repeat(rest.iter().product());
    Ok(Array::owned(t.dtype, base, row).select(0, &vec![0; first]))
}

/// The length of semantic `s` in the sample: an axis of it in a feature the sample
/// gives, at its declared rank (a feature the pipeline makes tells none).
fn length_in(plan: &Plan, s: &str, kept: &Sample) -> Option<usize> {
    plan.tensors()
        .filter(|(_, t)| t.derived.is_none())
        .find_map(|(n, t)| {
            let x = kept.get(n).filter(|x| x.dim() == t.axes.len())?;
            let d = t
                .axes
                .iter()
                .position(|a| a.semantic.as_deref() == Some(s))?;
            Some(x.shape()[d])
        })
}

/// `x[i..] * y[j..]` over every pair, in `d` (a bool product is a logical and). For a
/// 1-D `x` (a mask, as a pair mask's rule has it) the result is a view: one row per
/// distinct value of `x` (a mask's ones and zeros: two rows), selected per item, so a
/// source holds no serial copy of a pair feature it never received; the blocks are
/// written from those rows. An N-D `x` is written out whole.
fn outer(x: &Array, y: &Array, d: featshard_spec::ir::DType) -> Array<'static> {
    let cast = |v: f64| {
        let mut b = Vec::with_capacity(8);
        dtype::encode_f64(d, v, &mut b);
        let mut back = Vec::with_capacity(1);
        dtype::decode_into(d, &b, &mut back);
        back[0]
    };
    let ys: Vec<f64> = y.values().into_iter().map(cast).collect();
    let row_bytes = ys.len() * dtype::size(d);
    // Each distinct x value's row, made once (by bit pattern: 0 * -1 is -0).
    let mut first: HashMap<u64, usize> = HashMap::new();
    let (mut rows, mut which) = (Vec::new(), Vec::with_capacity(x.numel()));
    for a in x.values().into_iter().map(cast) {
        let next = first.len();
        let k = *first.entry(a.to_bits()).or_insert_with(|| {
            ys.iter()
                .for_each(|&b| dtype::encode_f64(d, a * b, &mut rows));
            next
        });
        which.push(k);
    }
    let mut shape = x.shape();
    shape.extend(y.shape());
    if x.dim() == 1 {
        let mut base = vec![first.len()];
        base.extend(y.shape());
        return Array::owned(d, base, rows).select(0, &which);
    }
    let mut bytes = Vec::with_capacity(which.len() * row_bytes);
    for k in which {
        bytes.extend_from_slice(&rows[k * row_bytes..(k + 1) * row_bytes]);
    }
    Array::owned(d, shape, bytes)
}

/// Whether `given` holds the values of `made` (a whole array of the same shape and
/// dtype), compared as numbers row by row (so `-0.0 == 0.0` and NaN equals nothing).
fn equal_values(given: &Array, made: &Array) -> bool {
    // A 1-D mask's one row is its items selected: written out whole (it is as long as
    // its items), so that it is a run like every row of a longer one.
    let whole;
    let made = match made.dim() {
        0 | 1 => {
            whole = made.contiguous();
            &whole
        }
        _ => made,
    };
    let d = made.dtype();
    let mut theirs = Vec::new();
    given
        .for_each_row(|idx, mine| {
            // `made` is whole, or rows selected whole (`outer`): every row is a run.
            let row = made.row_bytes(idx).ok_or(())?;
            theirs.clear();
            dtype::decode_into(d, row, &mut theirs);
            match mine == theirs.as_slice() {
                true => Ok(()),
                false => Err(()),
            }
        })
        .is_ok()
}

fn describe(rule: &DeriveRule) -> String {
    match rule {
        DeriveRule::Outer { of: [a, b] } => format!("the outer product of `{a}` and `{b}`"),
        DeriveRule::Valid => "a validity mask, 1 on every real item".to_owned(),
        DeriveRule::Halo { of, size } => {
            format!("the halo of `{of}`, {size} items each side of a block")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use featshard_spec::ir::DType;

    fn f32s(shape: Vec<usize>, v: &[f32]) -> Array<'static> {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Array::owned(DType::Float32, shape, bytes)
    }

    /// A mask's pair product is two rows selected per item, whatever the mask's length,
    /// and holds the bytes of the product written out (signed zeros included); an N-D
    /// `x` is written out whole.
    #[test]
    fn a_masks_outer_product_is_two_rows_selected_per_item() {
        let mask: Vec<f32> = (0..1000).map(|i| f32::from(u8::from(i % 3 != 0))).collect();
        let y: Vec<f32> = (0..1000)
            .map(|i| if i % 7 == 0 { -1.0 } else { 0.5 })
            .collect();
        let made = outer(
            &f32s(vec![1000], &mask),
            &f32s(vec![1000], &y),
            DType::Float32,
        );
        assert_eq!(
            (made.shape(), made.base_shape()),
            (vec![1000, 1000], &[2, 1000][..])
        );
        let want: Vec<u8> = mask
            .iter()
            .flat_map(|&a| y.iter().flat_map(move |&b| (a * b).to_le_bytes()))
            .collect();
        assert_eq!(made.to_bytes(), want);
        // A featurizer's own pair mask is checked against the view, row by row.
        let mut given = want.clone();
        let whole = Array::owned(DType::Float32, vec![1000, 1000], given.clone());
        assert!(equal_values(&whole, &made));
        given[4 * 1000 * 999] ^= 0x80;
        let flipped = Array::owned(DType::Float32, vec![1000, 1000], given);
        assert!(!equal_values(&flipped, &made));
        let x = [1.0, 0.0, 2.0, 1.0];
        let made = outer(
            &f32s(vec![2, 2], &x),
            &f32s(vec![3], &y[..3]),
            DType::Float32,
        );
        assert!(made.is_whole());
        assert_eq!(made.shape(), vec![2, 2, 3]);
        let want: Vec<u8> = x
            .iter()
            .flat_map(|&a| y[..3].iter().flat_map(move |&b| (a * b).to_le_bytes()))
            .collect();
        assert_eq!(made.to_bytes(), want);
    }
}
