//! The packed layout for windowed attention (see `featshard_spec::pack`): the windowed
//! semantic left-packed and end-padded to `W x cp0`, one-hot maps as id vectors.

use std::collections::BTreeMap;

use featshard_spec::ir::PadValue;
use featshard_spec::pack::{PackPlan, PackedForm, PAD_ID};
use featshard_spec::plan::Plan;
use featshard_spec::plan::CP_AXES;
use tch::{Kind, Tensor};

use crate::error::{RuntimeError, TorchContext};
use crate::intake::intake_checked;
use crate::pad::IntakeReport;
use crate::pad::{pad_feature, Padded};
use crate::sample::{Features, Options};
use crate::shard::{contiguous_stride, DTensorMeta, LocalBlock};
use crate::views::{new_written, view};
use featshard_exec::window::AxisMap;

/// A sample with one semantic packed.
#[derive(Debug)]
pub struct Packed {
    /// The features that do not touch the packed semantic, in the plan's layout.
    pub rest: Padded,
    /// The pack plan of the packed semantic.
    pub pack: PackPlan,
    /// Length of the packed axis (a multiple of `window x cp0`).
    pub packed_len: usize,
    /// The packed features.
    pub tensors: BTreeMap<String, Tensor>,
}

/// Validates a serial sample and lays it out with `semantic` packed.
pub fn pack(
    plan: &Plan,
    mesh: [usize; CP_AXES],
    features: &Features,
    opts: &Options,
    semantic: &str,
) -> Result<Packed, RuntimeError> {
    let pack = plan
        .pack_plan(semantic)
        .ok_or_else(|| RuntimeError::NoWindow {
            semantic: semantic.to_owned(),
        })?;
    let (taken, checked) = intake_checked(plan, features, opts)?;
    let features = &taken.features;
    let layout = plan.layout(mesh, &checked.sizes, &checked.owners)?;
    let shapes = plan.shapes_of(&layout, checked.names.iter().map(String::as_str))?;
    let positions: BTreeMap<String, Tensor> = layout
        .positions
        .iter()
        .map(|(s, p)| {
            let p: Vec<i64> = p.iter().map(|&v| v as i64).collect();
            (s.clone(), Tensor::from_slice(&p))
        })
        .collect();
    let len = checked.sizes.get(semantic).copied().unwrap_or(0);
    let packed_len = Plan::packed_length(pack.window, len, mesh);
    let mut packed = Packed {
        rest: Padded {
            layout,
            shapes,
            tensors: BTreeMap::new(),
            passthrough: checked
                .passthrough
                .iter()
                .map(|n| (n.clone(), features[n].shallow_clone()))
                .collect(),
            intake: IntakeReport {
                dropped: taken.dropped.clone(),
                arrived: taken.arrived.clone(),
                unowned: taken.unowned.clone(),
            },
        },
        packed_len,
        tensors: BTreeMap::new(),
        pack,
    };
    for name in &checked.names {
        let x = &features[name];
        let Some(pf) = packed.pack.features.get(name) else {
            let rest = &mut packed.rest;
            let out = pad_feature(plan, name, x, &rest.layout, &rest.shapes[name])?;
            rest.tensors.insert(name.clone(), out);
            continue;
        };
        let src = match &pf.form {
            PackedForm::Padded | PackedForm::SerialIds => x.shallow_clone(),
            PackedForm::Ids { axis, of } => ids(name, x, *axis, of, semantic, &positions)?,
        };
        let axes: Vec<AxisMap> = pf
            .axes
            .iter()
            .enumerate()
            .map(|(d, s)| match s.as_deref() {
                Some(s) if s == semantic => AxisMap {
                    padded: packed_len,
                    positions: None,
                },
                Some(s) => AxisMap {
                    padded: packed.rest.layout.padded.get(s).copied().unwrap_or(0),
                    positions: packed.rest.layout.positions.get(s).map(Vec::as_slice),
                },
                None => AxisMap {
                    padded: src.size()[d] as usize,
                    positions: None,
                },
            })
            .collect();
        let out = write_layout(plan, name, &src, pf.pad_value, &axes)?;
        packed.tensors.insert(name.clone(), out);
    }
    Ok(packed)
}

/// `x` in the layout `axes`, in a new tensor, by the byte executor.
fn write_layout(
    plan: &Plan,
    name: &str,
    x: &Tensor,
    pad: PadValue,
    axes: &[AxisMap],
) -> Result<Tensor, RuntimeError> {
    let seen = view(plan, name, x)?;
    let pad = featshard_exec::dtype::pad_bytes(seen.dtype(), pad);
    let shape: Vec<usize> = axes.iter().map(|a| a.padded).collect();
    let whole: Vec<(usize, usize)> = shape.iter().map(|&n| (0, n)).collect();
    new_written(name, &shape, x.kind(), x.device(), |sink| {
        featshard_exec::window::write_window(&seen, &pad, axes, &whole, sink)
    })
}

/// A one-hot map along `axis` as ids: the index of each row's one in `of`'s global
/// layout, `-1` for rows without one.
fn ids(
    name: &str,
    x: &Tensor,
    axis: usize,
    of: &str,
    packed: &str,
    positions: &BTreeMap<String, Tensor>,
) -> Result<Tensor, RuntimeError> {
    let axis = axis as i64;
    let has_one = x
        .f_sum_dim_intlist(axis, false, Kind::Int64)
        .and_then(|s| s.f_gt(0))
        .feature(name)?;
    let mut arg = if x.size()[axis as usize] == 0 {
        has_one.f_to_kind(Kind::Int64).feature(name)?
    } else {
        x.f_argmax(axis, false).feature(name)?
    };
    // Left-packed items keep serial ids; owner-partitioned ones move to their position.
    if of != packed {
        if let Some(pos) = positions.get(of) {
            arg = pos
                .f_index_select(0, &arg.f_flatten(0, -1).feature(name)?)
                .and_then(|v| v.f_view(arg.size().as_slice()))
                .feature(name)?;
        }
    }
    let pad = Tensor::from(PAD_ID);
    arg.f_where_self(&has_one, &pad).feature(name)
}

impl Packed {
    /// One feature's block on the rank at `coord`, with its DTensor metadata.
    pub fn block(
        &self,
        plan: &Plan,
        name: &str,
        coord: [usize; CP_AXES],
    ) -> Result<LocalBlock, RuntimeError> {
        let (Some(x), Some(pf)) = (self.tensors.get(name), self.pack.features.get(name)) else {
            return self.rest.block(plan, name, coord);
        };
        let mut view = x.shallow_clone();
        for (d, s) in pf.splits.iter().enumerate() {
            if let Some(m) = s.mesh_axis() {
                let n = x.size()[d] / self.rest.layout.mesh[m] as i64;
                view = view
                    .f_narrow(d as i64, coord[m] as i64 * n, n)
                    .feature(name)?;
            }
        }
        let global: Vec<usize> = x.size().iter().map(|&d| d as usize).collect();
        Ok(LocalBlock {
            tensor: view,
            meta: DTensorMeta {
                stride: contiguous_stride(&global),
                global_shape: global,
                placements: pf.placements.clone(),
            },
        })
    }
}
