//! Data-parallel collate: stack a replica's samples, agree on the largest local shape
//! across DP (one all-reduce of max), pad to it, re-pad indices into owner-partitioned
//! layouts, and prepend the DP placement.

use std::collections::BTreeMap;

use featshard_spec::layout::repad_indices;
use featshard_spec::plan::Plan;
use tch::{Device, Tensor};

use super::error::DistError;
use super::group::ReduceOp;
use super::local::LocalSample;
use super::mesh::Mesh;
use crate::error::{RuntimeError, TorchContext};
use crate::kind::{kind_of, scalar};
use crate::sample::{tensor_plan, to_vec_i64, Features};
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

/// Positions in a layout whose per-block stride grows from `old` to `new`, moved by the
/// spec's [`repad_indices`] (pads of index lists, negative, stay).
fn repad(name: &str, x: &Tensor, old: usize, new: usize) -> Result<Tensor, RuntimeError> {
    if old == 0 || old == new {
        return Ok(x.shallow_clone());
    }
    let mut values = to_vec_i64(x, name)?;
    repad_indices(&mut values, old, new).map_err(|v| RuntimeError::Blocks {
        feature: name.to_owned(),
        message: format!("index {v} re-padded from stride {old} to {new} passes int64"),
    })?;
    Tensor::from_slice(&values)
        .f_view(x.size().as_slice())
        .and_then(|v| v.f_to_kind(x.kind()))
        .and_then(|v| v.f_to(x.device()))
        .feature(name)
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

/// DP replicas must stack the same features (a sample may lack optional ones). A
/// presence vector over the plan's tensor features, the same length everywhere, is
/// reduced by min and max: where they differ, some replica lacks the feature. Every
/// rank returns the same error.
fn agree_on_features(mesh: &Mesh, plan: &Plan, names: &[String]) -> Result<(), DistError> {
    let all: Vec<&str> = plan.tensors().map(|(n, _)| n).collect();
    let here: Vec<i64> = all
        .iter()
        .map(|n| i64::from(names.iter().any(|m| m == n)))
        .collect();
    let reduce = |op| -> Result<Vec<i64>, DistError> {
        let mut t = Tensor::from_slice(&here).to_device(mesh.dp().device());
        mesh.dp().all_reduce(&mut t, op)?;
        Vec::<i64>::try_from(&t.to_device(Device::Cpu)).map_err(|e| DistError::Protocol {
            message: e.to_string(),
        })
    };
    let (lo, hi) = (reduce(ReduceOp::Min)?, reduce(ReduceOp::Max)?);
    let differ: Vec<String> = all
        .iter()
        .zip(lo.iter().zip(&hi))
        .filter(|(_, (a, b))| a != b)
        .map(|(n, _)| format!("`{n}`"))
        .collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(DistError::Protocol {
        message: format!(
            "collate: DP replicas hold different features: {} absent on some replicas",
            differ.join(", ")
        ),
    })
}

/// Stacks `batch` (this replica's samples, all of one workflow) into DTensor blocks on
/// `(dp, cp0, cp1)`. Every rank of the world calls it with the same batch length.
pub fn collate(mesh: &Mesh, plan: &Plan, batch: Vec<LocalSample>) -> Result<Batch, DistError> {
    let names = same_features(&batch)?;
    agree_on_features(mesh, plan, &names)?;
    let targets = agreed_shapes(mesh, &batch, &names)?;
    let mut blocks = BTreeMap::new();
    for name in &names {
        blocks.insert(name.clone(), stack(mesh, plan, &batch, name, &targets)?);
    }
    Ok(Batch {
        samples: batch.iter().map(|s| s.sample).collect(),
        blocks,
        passthrough: batch.into_iter().map(|s| s.passthrough).collect(),
    })
}

/// The features every sample of the batch holds (all the same, or an error).
fn same_features(batch: &[LocalSample]) -> Result<Vec<String>, DistError> {
    let Some(first) = batch.first() else {
        return Err(DistError::Setup {
            message: "collate: empty batch".into(),
        });
    };
    let names: Vec<String> = first.blocks.keys().cloned().collect();
    for s in batch {
        if s.blocks.keys().ne(names.iter()) {
            return Err(DistError::Protocol {
                message: format!(
                    "collate: sample {} has features {:?}, sample {} has {:?}",
                    first.sample,
                    names,
                    s.sample,
                    s.blocks.keys().collect::<Vec<_>>()
                ),
            });
        }
    }
    Ok(names)
}

/// Every feature's local shape in the batch: the largest length of each axis over the
/// batch and every DP replica (one all-reduce for all of them).
fn agreed_shapes(
    mesh: &Mesh,
    batch: &[LocalSample],
    names: &[String],
) -> Result<BTreeMap<String, Vec<usize>>, DistError> {
    let first = &batch[0];
    let mut longest = Vec::new();
    for name in names {
        for d in 0..first.blocks[name].tensor.dim() {
            longest.push(
                batch
                    .iter()
                    .map(|s| s.blocks[name].tensor.size()[d])
                    .max()
                    .unwrap_or(0),
            );
        }
    }
    let mut agreed = Tensor::from_slice(&longest).to_device(mesh.dp().device());
    mesh.dp().all_reduce(&mut agreed, ReduceOp::Max)?;
    let agreed =
        Vec::<i64>::try_from(&agreed.to_device(Device::Cpu)).map_err(|e| DistError::Protocol {
            message: e.to_string(),
        })?;
    let mut targets = BTreeMap::new();
    let mut k = 0;
    for name in names {
        let n = first.blocks[name].tensor.dim();
        let shape = agreed[k..k + n].iter().map(|&d| d as usize).collect();
        targets.insert(name.clone(), shape);
        k += n;
    }
    Ok(targets)
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
    let full: Vec<i64> = target.iter().map(|&d| d as i64).collect();
    let mut padded = Vec::with_capacity(batch.len());
    for s in batch {
        let mut x = s.blocks[name].tensor.shallow_clone();
        let local = local_shapes(s);
        let strides = plan.repad_strides(
            name,
            local.iter().map(|(n, v)| (n.as_str(), v.as_slice())),
            targets.iter().map(|(n, v)| (n.as_str(), v.as_slice())),
        );
        if let Some((old, new)) = strides {
            x = repad(name, &x, old, new)?;
        }
        let y = Tensor::f_full(
            full.as_slice(),
            scalar(t.pad_value),
            (kind_of(t.dtype), x.device()),
        )
        .feature(name)?;
        let mut region = y.shallow_clone();
        for (d, &n) in x.size().iter().enumerate() {
            region = region.f_narrow(d as i64, 0, n).feature(name)?;
        }
        region.f_copy_(&x).feature(name)?;
        padded.push(y);
    }
    let stacked = Tensor::f_stack(&padded, 0).feature(name)?;
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
