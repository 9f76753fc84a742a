//! One placed sample and one placed feature: a feature's index values moved to the
//! padded layout and its block-diagonal structure checked, the axis maps its blocks are
//! written by. What [`crate::place`] makes and every block writer reads.

use std::collections::BTreeMap;

use featshard_spec::ir::{DeriveRule, PadValue, Role};
use featshard_spec::plan::{FeatureShapes, Plan, Remap, SampleLayout, Split, TensorPlan};

use crate::array::Array;
use crate::dtype;
use crate::error::ExecError;
use crate::feature::tensor_plan;
use crate::window::AxisMap;

/// What intake removed from a sample as emitted, for manifests and messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IntakeReport {
    /// Keys removed from the sample, sorted.
    pub dropped: Vec<String>,
    /// Semantics whose axes arrived padded: the length they arrived with.
    pub arrived: BTreeMap<String, usize>,
    /// Owner-map rows without an owner dropped as pads, per semantic.
    pub unowned: BTreeMap<String, usize>,
}

/// A validated sample placed on one mesh, not yet padded.
#[derive(Debug)]
pub struct Placed<'a> {
    /// Padded lengths and owner-block positions.
    pub layout: SampleLayout,
    /// Every tensor feature's shapes.
    pub shapes: BTreeMap<String, FeatureShapes>,
    /// Every tensor feature at its serial shape, index values already in the padded
    /// layout (one-hot maps are moved by their axes instead).
    pub arrays: BTreeMap<String, Array<'a>>,
    /// Every tensor feature as intake made it: real items only, index values serial.
    pub taken: BTreeMap<String, Array<'a>>,
    /// Features carried along untouched.
    pub passthrough: BTreeMap<String, Array<'a>>,
    /// Every one-hot feature's indices at its serial shape (see [`crate::compact`]).
    pub compact: BTreeMap<String, Array<'static>>,
    /// Every sparse feature's room for entries: the most any rank's block holds.
    pub entries: BTreeMap<String, usize>,
    /// What intake did to the sample as emitted.
    pub intake: IntakeReport,
}

/// One validated feature ready to write: index values remapped to the padded layout,
/// nothing outside the diagonal blocks of a co-sharded feature.
pub fn place_feature<'a>(
    plan: &Plan,
    name: &str,
    x: &Array<'a>,
    layout: &SampleLayout,
    shapes: &FeatureShapes,
) -> Result<Array<'a>, ExecError> {
    let t = tensor_plan(plan, name)?;
    let axes = axis_maps(t, shapes, layout);
    check_local_ids(plan, name, t, x, &axes, layout)?;
    let x = remap_to_padded(t, x, layout);
    check_diagonal(name, t, &x, &axes, layout)?;
    Ok(x)
}

/// The axis maps of a feature under the plan's layout.
pub(crate) fn axis_maps<'l>(
    t: &TensorPlan,
    shapes: &FeatureShapes,
    layout: &'l SampleLayout,
) -> Vec<AxisMap<'l>> {
    // A key halo's first axis is laid out already (see `crate::halo`).
    let halo = t.derived.as_ref().and_then(DeriveRule::halo).is_some();
    t.axes
        .iter()
        .zip(&shapes.padded_shape)
        .enumerate()
        .map(|(d, (a, &padded))| AxisMap {
            padded,
            positions: a
                .semantic
                .as_ref()
                .filter(|_| !(halo && d == 0))
                .and_then(|s| layout.positions.get(s))
                .map(Vec::as_slice),
        })
        .collect()
}

/// Index values that point into an owner-partitioned layout move with their items
/// (checked to lie in range before).
fn remap_to_padded<'a>(t: &TensorPlan, x: &Array<'a>, layout: &SampleLayout) -> Array<'a> {
    let of = match &t.remap {
        Remap::ToPaddedLayout { of, .. } | Remap::ShardLocal { of, .. } => of,
        _ => return x.clone(),
    };
    let Some(pos) = layout.positions.get(of) else {
        return x.clone();
    };
    let d = x.dtype();
    let none = index_none(t);
    let mut bytes = Vec::with_capacity(x.numel() * dtype::size(d));
    for v in x.values().into_iter().map(|v| v as i64) {
        // The none value names no item: it stays none.
        let p = match usize::try_from(v).ok().and_then(|v| pos.get(v)) {
            Some(&p) if Some(v) != none => p as i64,
            _ => v,
        };
        dtype::encode_i64(d, p, &mut bytes);
    }
    Array::owned(d, x.shape(), bytes)
}

/// The none value of an index feature (see `IndexRole::none`), if it declares one.
pub(crate) fn index_none(t: &TensorPlan) -> Option<i64> {
    match &t.role {
        Role::Index(ix) => ix.none,
        _ => None,
    }
}

/// A shard-local id counts from the start of the shard that holds its item: a value
/// naming an item of another shard would arrive as another id (negative, or past the
/// block), silently. Checked on the serial values (in range, checked before), by the
/// padded position of the item holding each and of the item it names.
fn check_local_ids(
    plan: &Plan,
    name: &str,
    t: &TensorPlan,
    x: &Array,
    axes: &[AxisMap],
    layout: &SampleLayout,
) -> Result<(), ExecError> {
    let Remap::ShardLocal { of, mesh_axis } = &t.remap else {
        return Ok(());
    };
    let m = *mesh_axis;
    let Some((d, held)) = t
        .axes
        .iter()
        .enumerate()
        .find(|(_, a)| a.split.mesh_axis() == Some(m))
        .and_then(|(d, a)| Some((d, a.semantic.as_deref()?)))
    else {
        return Ok(());
    };
    if layout.mesh.size(m) <= 1 || d >= x.dim() {
        return Ok(());
    }
    let named = layout.positions.get(of.as_str());
    let last = x.dim() - 1;
    let off = x.for_each_row(|idx, row| {
        for (j, &v) in row.iter().enumerate() {
            if Some(v as i64) == index_none(t) {
                continue;
            }
            let item = if d == last { j } else { idx[d] };
            let target = named
                .and_then(|p| p.get(v as usize))
                .copied()
                .unwrap_or(v as usize);
            let holder = layout.shard_of(held, m, axes[d].position(item));
            let owner = layout.shard_of(of, m, target);
            if holder != owner {
                let mut at = idx.to_vec();
                at.push(j);
                return Err((v as i64, at, holder.unwrap_or(0), owner.unwrap_or(0)));
            }
        }
        Ok(())
    });
    let mesh_axis = plan.mesh.axes().get(m).cloned().unwrap_or_default();
    off.map_err(|(value, at, holder, target)| ExecError::OffShard {
        feature: name.to_owned(),
        axis: d,
        semantic: held.to_owned(),
        message: format!(
            "value {value} at {at:?} names {of} item {value}, held by shard {target} along `{mesh_axis}`, but this {held} item is held by shard {holder}: a shard_local id can only name an item of its own shard, and would arrive as another id (give `{held}` an owner, `owner: {of}`, so that its items go to their owner's shard, or use `scope: padded_global`)"
        ),
    })
}

/// A block-diagonal feature must have nothing outside its diagonal blocks, or
/// sharding would silently drop it. Checked on the serial values, by the padded
/// position of each entry.
fn check_diagonal(
    name: &str,
    t: &TensorPlan,
    x: &Array,
    axes: &[AxisMap],
    layout: &SampleLayout,
) -> Result<(), ExecError> {
    for (axis, a) in t.axes.iter().enumerate() {
        let Split::Follows { leader, mesh_axis } = a.split else {
            continue;
        };
        let parts = layout.mesh.size(mesh_axis);
        if parts == 1 {
            continue;
        }
        let pad = match t.pad_value {
            PadValue::Bool(b) => f64::from(u8::from(b)),
            PadValue::Int(i) => i as f64,
            PadValue::Float(v) => v,
        };
        // One-hot values are 0/1 (checked): a one counts; other features count what is
        // not the pad value.
        let one_hot = matches!(&t.role, Role::Index(ix) if ix.one_hot.is_some());
        let counts = |v: f64| if one_hot { v != 0.0 } else { v != pad };
        let (lead, follow) = (axes[leader].padded / parts, axes[axis].padded / parts);
        let block = |d: usize, i: usize, n: usize| axes[d].position(i) / n.max(1);
        let last = x.dim() - 1;
        let off_block = |idx: &[usize], j: usize| {
            let at = |d: usize| if d == last { j } else { idx[d] };
            block(leader, at(leader), lead) != block(axis, at(axis), follow)
        };
        let off = if one_hot || pad == 0.0 {
            // Only nonzero entries count: rows of zeros are skipped unread.
            x.for_each_row_nonzero(|idx, nz| match nz.iter().any(|&(j, _)| off_block(idx, j)) {
                true => Err(()),
                false => Ok(()),
            })
        } else {
            x.for_each_row(|idx, row| {
                match (0..row.len()).any(|j| counts(row[j]) && off_block(idx, j)) {
                    true => Err(()),
                    false => Ok(()),
                }
            })
        };
        if off.is_err() {
            return Err(ExecError::OffDiagonal {
                feature: name.to_owned(),
                axis,
                semantic: a.semantic.clone().unwrap_or_default(),
            });
        }
    }
    Ok(())
}
