//! Placing a validated sample on one mesh: its layout and shapes from the plan, index
//! values moved to the padded layout, block-diagonal features checked. Nothing large is
//! copied: features stay views of the input until their blocks are written.

use std::collections::BTreeMap;

use featshard_spec::plan::{Plan, SampleLayout};
use featshard_spec::Mesh;

use crate::array::Array;
use crate::blocks::feature_blocks;
use crate::compact::{map_indices, OneHot};
use crate::error::ExecError;
use crate::files::Sample;
use crate::intake::{intake, intake_any, Options};
use crate::placed::{place_feature, IntakeReport, Placed};
use crate::validate::check;

/// Validates a serial sample and places it on `mesh`: layout, shapes, index values
/// remapped, nothing outside the diagonal blocks of co-sharded features.
pub fn place<'a>(
    plan: &Plan,
    mesh: Mesh,
    features: &Sample<'a>,
    opts: &Options,
) -> Result<Placed<'a>, ExecError> {
    let taken = intake(plan, features, opts)?;
    place_taken(plan, mesh, taken)
}

/// [`place`] for a domain-parallel plan, on its domain mesh (a missing second axis of
/// size 1): every rank's block is then its window of the padded layout, a `torch.chunk`
/// piece on an uneven axis, so blocks differ in shape from rank to rank
/// ([`crate::blocks::FeatureBlocks::shape_of`]).
pub fn place_domain<'a>(
    plan: &Plan,
    mesh: Mesh,
    features: &Sample<'a>,
    opts: &Options,
) -> Result<Placed<'a>, ExecError> {
    if !plan.mesh.is_domain() {
        return Err(ExecError::Unsupported {
            message: format!("`{}` is a CP plan: place it with `place`", plan.module),
        });
    }
    place_taken(plan, mesh, intake_any(plan, features, opts)?)
}

fn place_taken<'a>(
    plan: &Plan,
    mesh: Mesh,
    taken: crate::intake::Intake<'a>,
) -> Result<Placed<'a>, ExecError> {
    let checked = check(plan, &taken)?;
    let layout = plan.layout(mesh, &checked.sizes, &checked.owners)?;
    let laid_out = checked.names.iter().chain(&taken.halos).map(String::as_str);
    let shapes = plan.shapes_of(&layout, laid_out)?;
    let mut arrays = BTreeMap::new();
    let mut kept = BTreeMap::new();
    for name in &checked.names {
        let s = shapes.get(name).ok_or_else(|| ExecError::Missing {
            feature: name.clone(),
        })?;
        let x = place_feature(plan, name, &taken.features[name], &layout, s)?;
        arrays.insert(name.clone(), x);
        kept.insert(name.clone(), taken.features[name].clone());
    }
    // Key halos, once their features' blocks are known: laid out already.
    for name in &taken.halos {
        let x = crate::halo::halo(plan, name, &layout, &shapes, &arrays)?;
        kept.insert(name.clone(), x.clone());
        arrays.insert(name.clone(), x);
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
    // A one-hot halo (rows of a one-hot feature) travels as its indices too.
    for name in &taken.halos {
        let t = crate::feature::tensor_plan(plan, name)?;
        if let Some(oh) = OneHot::of(t, &[]).filter(|o| !o.map) {
            compact.insert(
                name.clone(),
                crate::compact::indices(name, &arrays[name], &oh)?,
            );
        }
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
fn sparse_room(plan: &Plan, placed: &Placed) -> Result<BTreeMap<String, usize>, ExecError> {
    let mut out = BTreeMap::new();
    for blocks in feature_blocks(plan, placed)? {
        if !plan.tensor(&blocks.name).is_some_and(|t| t.sparse) {
            continue;
        }
        let mut most = 0;
        for coord in placed.layout.mesh.coords() {
            let n = blocks.count_entries(coord).map_err(|e| ExecError::Blocks {
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
