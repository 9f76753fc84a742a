//! The packed layout for windowed attention (see `featshard_spec::pack`) on tch
//! tensors: the windowed semantic left-packed and end-padded to `W x cp0`, one-hot maps
//! as id vectors, each packed tensor written by the byte executor
//! (`featshard_exec::packed`) and each rank's block its window of it.

use std::collections::BTreeMap;

use featshard_spec::pack::PackPlan;
use featshard_spec::plan::Plan;
use featshard_spec::{Coord, Mesh};
use tch::Tensor;

use crate::error::{RuntimeError, TorchContext};
use crate::intake::intake_checked;
use crate::kind::kind_of;
use crate::pad::IntakeReport;
use crate::pad::{pad_feature, Padded};
use crate::sample::{Features, Options};
use crate::shard::{contiguous_stride, DTensorMeta, LocalBlock};
use crate::views::{new_written, view};

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
    mesh: Mesh,
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
        let seen = view(plan, name, x)?;
        let layout = &packed.rest.layout;
        let Some(w) =
            featshard_exec::packed::packed(&packed.pack, layout, packed_len, name, &seen)?
        else {
            let rest = &mut packed.rest;
            let out = pad_feature(plan, name, x, &rest.layout, &rest.shapes[name])?;
            rest.tensors.insert(name.clone(), out);
            continue;
        };
        let out = new_written(name, &w.shape(), kind_of(w.dtype()), x.device(), |sink| {
            w.write(sink)
        })?;
        packed.tensors.insert(name.clone(), out);
    }
    Ok(packed)
}

impl Packed {
    /// One feature's block on the rank at `coord`, with its DTensor metadata.
    pub fn block(&self, plan: &Plan, name: &str, coord: Coord) -> Result<LocalBlock, RuntimeError> {
        let (Some(x), Some(pf)) = (self.tensors.get(name), self.pack.features.get(name)) else {
            return self.rest.block(plan, name, coord);
        };
        let global: Vec<usize> = x.size().iter().map(|&d| d as usize).collect();
        let mut view = x.shallow_clone();
        let window = pf.block_window(&global, self.rest.layout.mesh, coord);
        for (d, (&(start, len), &n)) in window.iter().zip(&global).enumerate() {
            if len != n {
                view = view
                    .f_narrow(d as i64, start as i64, len as i64)
                    .feature(name)?;
            }
        }
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
