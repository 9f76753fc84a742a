//! Placing a validated sample on one mesh: its layout and shapes from the plan, index
//! values moved to the padded layout, block-diagonal features checked. Nothing large is
//! copied: features stay views of the input until their blocks are written.

use std::collections::BTreeMap;

use featshard_spec::ir::{PadValue, Role};
use featshard_spec::plan::{FeatureShapes, Plan, Remap, SampleLayout, TensorPlan};
use featshard_spec::plan::{Split, CP_AXES};

use crate::array::Array;
use crate::blocks::feature_blocks;
use crate::compact::{map_indices, OneHot};
use crate::dtype;
use crate::error::RuntimeError;
use crate::files::Sample;
use crate::intake::{intake, intake_any, Options};
use crate::validate::{check, tensor_plan};

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

/// Validates a serial sample and places it on `mesh`: layout, shapes, index values
/// remapped, nothing outside the diagonal blocks of co-sharded features.
pub fn place<'a>(
    plan: &Plan,
    mesh: [usize; CP_AXES],
    features: &Sample<'a>,
    opts: &Options,
) -> Result<Placed<'a>, RuntimeError> {
    let taken = intake(plan, features, opts)?;
    place_taken(plan, mesh, taken)
}

/// [`place`] for a domain-parallel plan, on its domain mesh (a missing second axis of
/// size 1): every rank's block is then its window of the padded layout, a `torch.chunk`
/// piece on an uneven axis, so blocks differ in shape from rank to rank
/// ([`crate::blocks::FeatureBlocks::shape_of`]).
pub fn place_domain<'a>(
    plan: &Plan,
    mesh: [usize; CP_AXES],
    features: &Sample<'a>,
    opts: &Options,
) -> Result<Placed<'a>, RuntimeError> {
    if !plan.mesh.is_domain() {
        return Err(RuntimeError::Unsupported {
            message: format!("`{}` is a CP plan: place it with `place`", plan.module),
        });
    }
    place_taken(plan, mesh, intake_any(plan, features, opts)?)
}

fn place_taken<'a>(
    plan: &Plan,
    mesh: [usize; CP_AXES],
    taken: crate::intake::Intake<'a>,
) -> Result<Placed<'a>, RuntimeError> {
    let checked = check(plan, &taken)?;
    let layout = plan.layout(mesh, &checked.sizes, &checked.owners)?;
    let shapes = plan.shapes_of(&layout, checked.names.iter().map(String::as_str))?;
    let mut arrays = BTreeMap::new();
    let mut kept = BTreeMap::new();
    for name in &checked.names {
        let s = shapes.get(name).ok_or_else(|| RuntimeError::Missing {
            feature: name.clone(),
        })?;
        let x = place_feature(plan, name, &taken.features[name], &layout, s)?;
        arrays.insert(name.clone(), x);
        kept.insert(name.clone(), taken.features[name].clone());
    }
    let passthrough = checked
        .passthrough
        .iter()
        .map(|n| (n.clone(), taken.features[n].clone()))
        .collect();
    let mut compact = checked.compact;
    for name in &checked.names {
        compact.extend(map_indices_of(plan, name, &kept[name], &layout));
    }
    let mut placed = Placed {
        layout,
        shapes,
        arrays,
        taken: kept,
        passthrough,
        compact,
        entries: BTreeMap::new(),
        intake: IntakeReport {
            dropped: taken.dropped,
            arrived: taken.arrived,
            unowned: taken.unowned,
        },
    };
    placed.entries = sparse_room(plan, &placed)?;
    Ok(placed)
}

/// Every sparse feature's room for entries: the most nonzero elements any rank's block
/// holds, counted through the same windows the blocks are written by.
fn sparse_room(plan: &Plan, placed: &Placed) -> Result<BTreeMap<String, usize>, RuntimeError> {
    let [m0, m1] = placed.layout.mesh;
    let mut out = BTreeMap::new();
    for blocks in feature_blocks(plan, placed)? {
        if !plan.tensor(&blocks.name).is_some_and(|t| t.sparse) {
            continue;
        }
        let mut most = 0;
        for coord in (0..m0).flat_map(|i| (0..m1).map(move |j| [i, j])) {
            let n = blocks
                .count_entries(coord)
                .map_err(|e| RuntimeError::Blocks {
                    feature: blocks.name.clone(),
                    message: e.to_string(),
                })?;
            most = most.max(n);
        }
        out.insert(blocks.name.clone(), most);
    }
    Ok(out)
}

/// A one-hot map's compact indices (see [`crate::compact`]), if it has a compact form.
fn map_indices_of(
    plan: &Plan,
    name: &str,
    x: &Array,
    layout: &SampleLayout,
) -> Option<(String, Array<'static>)> {
    let t = plan.tensor(name)?;
    let oh = OneHot::of(t, &x.shape()).filter(|o| o.map)?;
    let semantic = t.axes.get(oh.axis)?.semantic.as_deref()?;
    let positions = layout.positions.get(semantic).map(Vec::as_slice);
    Some((name.to_owned(), map_indices(x, positions)))
}

/// One validated feature ready to write: index values remapped to the padded layout,
/// nothing outside the diagonal blocks of a co-sharded feature.
pub fn place_feature<'a>(
    plan: &Plan,
    name: &str,
    x: &Array<'a>,
    layout: &SampleLayout,
    shapes: &FeatureShapes,
) -> Result<Array<'a>, RuntimeError> {
    let t = tensor_plan(plan, name)?;
    let x = remap_to_padded(t, x, layout);
    check_diagonal(name, t, &x, &axis_maps(t, shapes, layout), layout)?;
    Ok(x)
}

/// Where one axis' serial items go in the padded layout.
#[derive(Clone, Copy, Debug)]
pub struct AxisMap<'a> {
    /// The padded length.
    pub padded: usize,
    /// Position of every item; `None`: items keep their place and the end is padded.
    pub positions: Option<&'a [usize]>,
}

impl AxisMap<'_> {
    /// The padded position of serial item `i`.
    pub fn position(&self, i: usize) -> usize {
        self.positions.map_or(i, |p| p[i])
    }
}

/// The axis maps of a feature under the plan's layout.
pub fn axis_maps<'l>(
    t: &TensorPlan,
    shapes: &FeatureShapes,
    layout: &'l SampleLayout,
) -> Vec<AxisMap<'l>> {
    t.axes
        .iter()
        .zip(&shapes.padded_shape)
        .map(|(a, &padded)| AxisMap {
            padded,
            positions: a
                .semantic
                .as_ref()
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
    let mut bytes = Vec::with_capacity(x.numel() * dtype::size(d));
    for v in x.values() {
        let p = pos.get(v as usize).copied().unwrap_or(0);
        dtype::encode_i64(d, p as i64, &mut bytes);
    }
    Array::owned(d, x.shape(), bytes)
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
) -> Result<(), RuntimeError> {
    for (axis, a) in t.axes.iter().enumerate() {
        let Split::Follows { leader, mesh_axis } = a.split else {
            continue;
        };
        let parts = layout.mesh[mesh_axis];
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
            return Err(RuntimeError::OffDiagonal {
                feature: name.to_owned(),
                axis,
                semantic: a.semantic.clone().unwrap_or_default(),
            });
        }
    }
    Ok(())
}
