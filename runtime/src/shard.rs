//! Per-rank blocks of a padded sample, their DTensor metadata, and assembly back.
//!
//! A rank at CP mesh coordinate `coord` (rank `mesh.rank(coord)`) holds, for each feature,
//! the narrow of the padded tensor along every split axis: a view, not a copy. A
//! co-sharded (follower) axis is narrowed with its leader's coordinate, which keeps the
//! diagonal block and makes its one-hot ids shard-local.

use std::collections::BTreeMap;

use featshard_exec::assemble::Dense;
use featshard_exec::local_ids::{self, Direction};
use featshard_spec::ir::Placement;
use featshard_spec::plan::{Plan, Remap, SampleLayout, TensorPlan};
use featshard_spec::{Coord, Mesh};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::error::{RuntimeError, TorchContext};
use crate::kind::kind_of;
use crate::pad::{dims, Padded, Placed};
use crate::sample::{tensor_plan, Features};
use crate::views::{view, views, write_into};

/// What `DTensor.from_local` needs besides the local tensor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DTensorMeta {
    /// The DTensor's global shape.
    pub global_shape: Vec<usize>,
    /// Contiguous strides of the global shape.
    pub stride: Vec<usize>,
    /// Placements on the CP sub-mesh `(cp0, cp1)`.
    pub placements: Vec<Placement>,
}

/// One rank's block of one feature.
#[derive(Debug)]
pub struct LocalBlock {
    /// The rank's block.
    pub tensor: Tensor,
    /// What `DTensor.from_local` needs besides the block.
    pub meta: DTensorMeta,
}

pub use featshard_spec::layout::contiguous_stride;

impl Padded {
    /// The CP mesh the sample is laid out on.
    pub fn mesh(&self) -> Mesh {
        self.layout.mesh
    }

    /// How many ranks the CP mesh holds.
    pub fn world_size(&self) -> usize {
        self.layout.mesh.ranks()
    }

    /// One feature's block on the rank at `coord`.
    pub fn block(&self, plan: &Plan, name: &str, coord: Coord) -> Result<LocalBlock, RuntimeError> {
        let t = tensor_plan(plan, name)?;
        let x = self
            .tensors
            .get(name)
            .ok_or_else(|| RuntimeError::Missing {
                feature: name.to_owned(),
            })?;
        let shapes = &self.shapes[name];
        let view = narrow_to_block(name, t, x, &shapes.local_shape, coord)?;
        let view = match t.remap {
            Remap::ShardLocal { .. } => to_local_ids(plan, name, t, &view, coord, &self.layout)?,
            _ => view,
        };
        Ok(LocalBlock {
            tensor: view,
            meta: DTensorMeta {
                global_shape: shapes.global_shape.clone(),
                stride: contiguous_stride(&shapes.global_shape),
                placements: t.placements.clone(),
            },
        })
    }

    /// Every feature's block on one rank, sorted by name.
    pub fn rank_blocks(
        &self,
        plan: &Plan,
        rank: usize,
    ) -> Result<BTreeMap<String, LocalBlock>, RuntimeError> {
        let coord = self.mesh().coord(rank);
        self.tensors
            .keys()
            .map(|n| Ok((n.clone(), self.block(plan, n, coord)?)))
            .collect()
    }
}

impl Placed {
    /// One feature's block on the rank at `coord`, written into `out` (a tensor or view
    /// of the block's shape and dtype) by the byte executor, straight from the serial
    /// sample: the values [`Padded::block`] views.
    pub fn write_block(
        &self,
        plan: &Plan,
        name: &str,
        coord: Coord,
        out: &mut Tensor,
    ) -> Result<DTensorMeta, RuntimeError> {
        let t = tensor_plan(plan, name)?;
        self.with_blocks(plan, name, |blocks, _, shapes| {
            let kind = kind_of(blocks.dtype);
            if out.size() != dims(&shapes.local_shape) || out.kind() != kind {
                return Err(RuntimeError::Blocks {
                    feature: name.to_owned(),
                    message: format!(
                        "a block of shape {:?} ({:?}) written into a {:?} tensor of shape {:?}",
                        shapes.local_shape,
                        kind,
                        out.kind(),
                        out.size()
                    ),
                });
            }
            write_into(name, out, |sink| blocks.write(coord, sink))?;
            Ok(DTensorMeta {
                global_shape: shapes.global_shape.clone(),
                stride: contiguous_stride(&shapes.global_shape),
                placements: t.placements.clone(),
            })
        })
    }
}

/// The region of a feature's padded layout the rank at `coord` holds, `(start, len)`
/// per axis: a co-sharded (follower) axis takes its leader's coordinate.
pub(crate) fn block_window(t: &TensorPlan, local: &[usize], coord: Coord) -> Vec<(i64, i64)> {
    t.block_window(local, coord)
        .into_iter()
        .map(|(start, n)| (start as i64, n as i64))
        .collect()
}

fn narrow_to_block(
    name: &str,
    t: &TensorPlan,
    x: &Tensor,
    local: &[usize],
    coord: Coord,
) -> Result<Tensor, RuntimeError> {
    let mut view = x.shallow_clone();
    for (d, &(start, len)) in block_window(t, local, coord).iter().enumerate() {
        if t.axes[d].split.mesh_axis().is_some() {
            view = view.f_narrow(d as i64, start, len).feature(name)?;
        }
    }
    Ok(view)
}

/// A block of the padded layout with its shard-local ids made local, in a new tensor
/// (by the byte executor, `featshard_exec::local_ids`).
fn to_local_ids(
    plan: &Plan,
    name: &str,
    t: &TensorPlan,
    block: &Tensor,
    coord: Coord,
    layout: &SampleLayout,
) -> Result<Tensor, RuntimeError> {
    let shape: Vec<usize> = block.size().iter().map(|&d| d as usize).collect();
    let mut bytes = view(plan, name, block)?.to_bytes();
    local_ids::shift(
        name,
        t,
        layout,
        &shape,
        coord,
        &mut bytes,
        Direction::ToLocal,
    )?;
    Tensor::f_from_data_size(&bytes, &dims(&shape), block.kind())
        .and_then(|y| y.f_to_device(block.device()))
        .feature(name)
}

/// Every rank's blocks (rank-ordered) back into the padded global features, by the
/// byte executor (`featshard_exec::assemble`) on views of the blocks.
///
/// Ranks that hold the same region of a replicated axis must hold the same values.
pub fn assemble(
    plan: &Plan,
    layout: &SampleLayout,
    workflow: Option<&str>,
    ranks: &[Features],
) -> Result<Features, RuntimeError> {
    let seen = ranks
        .iter()
        .map(|r| views(plan, r))
        .collect::<Result<Vec<_>, _>>()?;
    let padded = featshard_exec::assemble::assemble(plan, layout, workflow, &seen)?;
    into_tensors(padded)
}

/// The padded global features back to the serial sample (pads dropped, items of
/// owner-partitioned axes back in serial order, padded-layout indices back to serial),
/// by the byte executor (`featshard_exec::assemble::unpad`).
pub fn unpad(
    plan: &Plan,
    layout: &SampleLayout,
    padded: &BTreeMap<String, Tensor>,
) -> Result<Features, RuntimeError> {
    let dense = views(plan, padded)?
        .into_iter()
        .map(|(n, a)| {
            let d = Dense {
                dtype: a.dtype(),
                shape: a.shape(),
                bytes: a.to_bytes(),
            };
            (n, d)
        })
        .collect();
    into_tensors(featshard_exec::assemble::unpad(plan, layout, dense)?)
}

/// The executor's owned features as CPU tensors.
fn into_tensors(features: BTreeMap<String, Dense>) -> Result<Features, RuntimeError> {
    features
        .into_iter()
        .map(|(name, d)| {
            let shape = dims(&d.shape);
            let t = Tensor::f_from_data_size(&d.bytes, &shape, kind_of(d.dtype)).feature(&name)?;
            Ok((name, t))
        })
        .collect()
}
