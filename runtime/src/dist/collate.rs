//! Data-parallel collate: stack a replica's samples, agree on the largest local shape
//! across DP (one all-reduce of max), pad to it, re-pad indices into owner-partitioned
//! layouts, and prepend the DP placement.

use std::collections::BTreeMap;

use featshard_exec::agree::Status;
use featshard_exec::collate::{collate_frame, collate_targets, failed_frame, Join, Others};
use featshard_spec::plan::Plan;
use tch::{Device, Tensor};

use super::agree::settle;
use super::error::DistError;
use super::group::ReduceOp;
use super::local::LocalSample;
use super::mesh::Mesh;
use crate::error::{RuntimeError, TorchContext};
use crate::kind::{kind_of, scalar};
use crate::sample::{tensor_plan, Features};
use crate::shard::{contiguous_stride, DTensorMeta, LocalBlock};

/// One DP replica's batch on this rank.
#[derive(Debug)]
pub struct Batch {
    /// Dataset indices of the samples, in batch order.
    pub samples: Vec<usize>,
    /// `[batch, ...local]` tensors with DTensor metadata on `(dp, cp0, cp1)`.
    pub blocks: BTreeMap<String, LocalBlock>,
    /// Passed-through features of each sample.
    pub passthrough: Vec<Features>,
}

/// A sample's block written into `out`, its place in the batch, as the executor's
/// [`Join`] says: index values re-padded, the block at the start of `out` (already the
/// pad value), on the block's device.
fn join_into(name: &str, x: &Tensor, join: &Join, out: &Tensor) -> Result<(), RuntimeError> {
    let x = match join.repad {
        Some((old, new)) => {
            let (old, new) = (old as i64, new as i64);
            let moved = x
                .f_div_scalar_mode(old, "floor")
                .and_then(|q| q.f_mul_scalar(new))
                .and_then(|q| q.f_add(&x.f_remainder(old)?));
            // Negative values (pads of index lists) stay.
            moved
                .and_then(|m| m.f_where_self(&x.f_ge(0)?, x))
                .feature(name)?
        }
        None => x.shallow_clone(),
    };
    // A spread axis is viewed as its blocks, `[k, new]` over `[k, old]`, last axis
    // first so that the earlier axes keep their numbers.
    let (mut x, mut region) = (x, out.shallow_clone());
    let mut spread = join.spread.clone();
    spread.sort_by_key(|s| std::cmp::Reverse(s.axis));
    for s in &spread {
        let (axis, old, new) = (s.axis as i64, s.old as i64, s.new as i64);
        let k = x.size()[s.axis] / old;
        x = x.f_unflatten(axis, [k, old]).feature(name)?;
        region = region.f_unflatten(axis, [-1, new]).feature(name)?;
    }
    for (d, &n) in x.size().iter().enumerate() {
        region = region.f_narrow(d as i64, 0, n).feature(name)?;
    }
    region.f_copy_(&x).feature(name)
}

/// Every block's local shape in a sample, by feature name.
fn local_shapes(sample: &LocalSample) -> BTreeMap<String, Vec<usize>> {
    sample
        .blocks
        .iter()
        .map(|(n, b)| {
            (
                n.clone(),
                b.tensor.size().iter().map(|&d| d as usize).collect(),
            )
        })
        .collect()
}

/// Stacks `batch` (this replica's samples, all of one workflow) into DTensor blocks on
/// `(dp, cp0, cp1)`. Every rank of the world calls it; a batch one replica cannot
/// collate (empty, samples holding different keys, batches of different sizes) is
/// every rank's same error.
pub fn collate(mesh: &Mesh, plan: &Plan, batch: Vec<LocalSample>) -> Result<Batch, DistError> {
    let shapes: Vec<BTreeMap<String, Vec<usize>>> = batch.iter().map(local_shapes).collect();
    let others: Vec<Others> = batch.iter().map(passed_through).collect();
    let targets = agreed_targets(mesh, plan, &shapes, &others)?;
    let mut blocks = BTreeMap::new();
    for name in targets.keys() {
        blocks.insert(name.clone(), stack(mesh, plan, &batch, name, &targets)?);
    }
    Ok(Batch {
        samples: batch.iter().map(|s| s.sample).collect(),
        blocks,
        passthrough: batch.into_iter().map(|s| s.passthrough).collect(),
    })
}

/// A sample's passed-through features, which collate keeps per sample (their keys
/// must match; they are not stacked).
fn passed_through(sample: &LocalSample) -> Others {
    sample
        .passthrough
        .keys()
        .map(|k| (k.clone(), None))
        .collect()
}

/// Every held feature's local shape in the batch, agreed with the other DP replicas in
/// one all-reduce of max of the executor's collate frame (`featshard_exec::collate`);
/// a replica that cannot collate still reduces a failed frame, and then every rank's
/// status frame decides the error all return.
fn agreed_targets(
    mesh: &Mesh,
    plan: &Plan,
    shapes: &[BTreeMap<String, Vec<usize>>],
    others: &[Others],
) -> Result<BTreeMap<String, Vec<usize>>, DistError> {
    let (frame, status) = match collate_frame(plan, shapes, others) {
        Ok(frame) => (frame, Status::Ok),
        Err(e) => (
            failed_frame(plan),
            Status::Rank {
                rank: mesh.rank(),
                kind: None,
                message: e.to_string(),
            },
        ),
    };
    let mut reduced = Tensor::from_slice(&frame.frame).to_device(mesh.dp().device());
    mesh.dp().all_reduce(&mut reduced, ReduceOp::Max)?;
    let reduced =
        Vec::<i64>::try_from(&reduced.to_device(Device::Cpu)).map_err(|e| DistError::Protocol {
            message: e.to_string(),
        })?;
    match collate_targets(plan, &frame, &reduced)? {
        Some(targets) => Ok(targets),
        None => {
            settle(mesh.dp(), status, None)?;
            Err(DistError::Protocol {
                message: "collate: a replica's frame failed, but no rank says why".into(),
            })
        }
    }
}

/// One feature's samples padded to the agreed shape (owner-block indices re-padded)
/// and stacked along a new DP axis, with its DTensor metadata.
fn stack(
    mesh: &Mesh,
    plan: &Plan,
    batch: &[LocalSample],
    name: &String,
    targets: &BTreeMap<String, Vec<usize>>,
) -> Result<LocalBlock, DistError> {
    let t = tensor_plan(plan, name)?;
    let target = &targets[name];
    let device = batch
        .first()
        .map_or(Device::Cpu, |s| s.blocks[name].tensor.device());
    let mut full = vec![batch.len() as i64];
    full.extend(target.iter().map(|&d| d as i64));
    let stacked = Tensor::f_full(
        full.as_slice(),
        scalar(t.pad_value),
        (kind_of(t.dtype), device),
    )
    .feature(name)?;
    for (i, s) in batch.iter().enumerate() {
        let join = featshard_exec::collate::join(plan, name, &local_shapes(s), targets)?;
        let out = stacked.f_select(0, i as i64).feature(name)?;
        join_into(name, &s.blocks[name].tensor, &join, &out)?;
    }
    let shape = t.collated_global_shape(target, batch.len(), mesh.dp_size(), mesh.cp_shape());
    Ok(LocalBlock {
        tensor: stacked,
        meta: DTensorMeta {
            stride: contiguous_stride(&shape),
            global_shape: shape,
            placements: t.placements_dp.clone(),
        },
    })
}
