//! Padding: one serial sample -> the global padded layout of a mesh, and back.
//!
//! Each feature is written once: a tensor of its padded shape is filled with the pad
//! value and the serial values are copied into it (`index_copy_` along an
//! owner-partitioned axis, a plain copy into a narrowed view otherwise).

use std::collections::BTreeMap;

use featshard_spec::infer::CP_AXES;
use featshard_spec::plan::{FeatureShapes, Plan, Remap, SampleLayout, TensorPlan};
use tch::{Device, Kind, Tensor};

use crate::error::{RuntimeError, TorchContext};
use crate::kind::{kind_of, scalar};
use crate::sample::{check, tensor_plan, Features, Options};

/// One sample in the padded global layout of one mesh.
#[derive(Debug)]
pub struct Padded {
    pub layout: SampleLayout,
    pub shapes: BTreeMap<String, FeatureShapes>,
    /// Every tensor feature at its padded shape.
    pub tensors: BTreeMap<String, Tensor>,
    /// Features carried along untouched.
    pub passthrough: BTreeMap<String, Tensor>,
}

/// Validates a serial sample and pads it for `mesh`.
pub fn pad(
    plan: &Plan,
    mesh: [usize; CP_AXES],
    features: &Features,
    opts: &Options,
) -> Result<Padded, RuntimeError> {
    let checked = check(plan, features, opts)?;
    let layout = plan.layout(mesh, &checked.sizes, &checked.owners)?;
    let shapes = plan.shapes(&layout, opts.workflow.as_deref())?;
    let positions = position_tensors(&layout);
    let mut tensors = BTreeMap::new();
    for name in &checked.names {
        let t = tensor_plan(plan, name)?;
        let x = remap_to_padded(name, t, &features[name], &positions)?;
        let out = pad_one(name, t, &x, &shapes[name], &positions)?;
        check_diagonal(name, t, &out, &layout)?;
        tensors.insert(name.clone(), out);
    }
    let passthrough = checked
        .passthrough
        .iter()
        .map(|n| (n.clone(), features[n].shallow_clone()))
        .collect();
    Ok(Padded {
        layout,
        shapes,
        tensors,
        passthrough,
    })
}

pub(crate) fn position_tensors(layout: &SampleLayout) -> BTreeMap<String, Tensor> {
    layout
        .positions
        .iter()
        .map(|(s, p)| {
            let p: Vec<i64> = p.iter().map(|&v| v as i64).collect();
            (s.clone(), Tensor::from_slice(&p))
        })
        .collect()
}

pub(crate) fn dims(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&d| d as i64).collect()
}

/// Index values that point into an owner-partitioned layout move with their items.
fn remap_to_padded(
    name: &str,
    t: &TensorPlan,
    x: &Tensor,
    positions: &BTreeMap<String, Tensor>,
) -> Result<Tensor, RuntimeError> {
    let of = match &t.remap {
        Remap::ToPaddedLayout { of, .. } | Remap::ShardLocal { of, .. } => of,
        _ => return Ok(x.shallow_clone()),
    };
    let Some(pos) = positions.get(of) else {
        return Ok(x.shallow_clone());
    };
    let flat = x.f_flatten(0, -1).feature(name)?;
    pos.f_index_select(0, &flat)
        .and_then(|v| v.f_view(x.size().as_slice()))
        .and_then(|v| v.f_to_kind(x.kind()))
        .feature(name)
}

fn pad_one(
    name: &str,
    t: &TensorPlan,
    x: &Tensor,
    shapes: &FeatureShapes,
    positions: &BTreeMap<String, Tensor>,
) -> Result<Tensor, RuntimeError> {
    let padded = dims(&shapes.padded_shape);
    let out = Tensor::f_full(
        padded.as_slice(),
        scalar(t.pad_value),
        (kind_of(t.dtype), x.device()),
    )
    .feature(name)?;
    // Owner-partitioned axes scatter by position; the others keep their prefix.
    let owned: Vec<(usize, &Tensor)> = t
        .axes
        .iter()
        .enumerate()
        .filter_map(|(d, a)| {
            let s = a.semantic.as_ref()?;
            positions.get(s).map(|p| (d, p))
        })
        .collect();
    let mut src = x.shallow_clone();
    // With several owned axes, all but the last are scattered into intermediates.
    for &(d, pos) in owned.iter().take(owned.len().saturating_sub(1)) {
        let mut shape = src.size();
        shape[d] = padded[d];
        let mut tmp = Tensor::f_full(
            shape.as_slice(),
            scalar(t.pad_value),
            (src.kind(), src.device()),
        )
        .feature(name)?;
        let _ = tmp.f_index_copy_(d as i64, pos, &src).feature(name)?;
        src = tmp;
    }
    let mut view = out.shallow_clone();
    for (d, &n) in src.size().iter().enumerate() {
        let last_owned = owned.last().map(|(o, _)| *o);
        if Some(d) != last_owned && n != padded[d] {
            view = view.f_narrow(d as i64, 0, n).feature(name)?;
        }
    }
    match owned.last() {
        Some(&(d, pos)) => {
            let _ = view.f_index_copy_(d as i64, pos, &src).feature(name)?;
        }
        None => view.f_copy_(&src).feature(name)?,
    }
    Ok(out)
}

/// A block-diagonal feature must have nothing outside its diagonal blocks, or
/// sharding would silently drop it.
fn check_diagonal(
    name: &str,
    t: &TensorPlan,
    out: &Tensor,
    layout: &SampleLayout,
) -> Result<(), RuntimeError> {
    use featshard_spec::infer::Split;
    for (axis, a) in t.axes.iter().enumerate() {
        let Split::Follows { leader, mesh_axis } = a.split else {
            continue;
        };
        let parts = layout.mesh[mesh_axis] as i64;
        if parts == 1 {
            continue;
        }
        let count = |x: &Tensor| -> Result<i64, RuntimeError> {
            let ne = x.f_ne(scalar(t.pad_value)).feature(name)?;
            ne.f_sum(Kind::Int64)
                .and_then(|s| s.f_int64_value(&[]))
                .feature(name)
        };
        let total = count(out)?;
        let (lead_len, follow_len) = (out.size()[leader] / parts, out.size()[axis] / parts);
        let mut diagonal = 0;
        for c in 0..parts {
            let block = out
                .f_narrow(leader as i64, c * lead_len, lead_len)
                .and_then(|b| b.f_narrow(axis as i64, c * follow_len, follow_len))
                .feature(name)?;
            diagonal += count(&block)?;
        }
        if total != diagonal {
            return Err(RuntimeError::OffDiagonal {
                feature: name.to_owned(),
                axis,
                semantic: a.semantic.clone().unwrap_or_default(),
            });
        }
    }
    Ok(())
}

/// The padded global features back to the serial sample: pads dropped, items of
/// owner-partitioned axes back in serial order, padded-global indices back to serial.
pub fn unpad(
    plan: &Plan,
    layout: &SampleLayout,
    padded: &BTreeMap<String, Tensor>,
) -> Result<Features, RuntimeError> {
    let positions = position_tensors(layout);
    let mut out = BTreeMap::new();
    for (name, x) in padded {
        let t = tensor_plan(plan, name)?;
        let mut y = x.shallow_clone();
        for (d, a) in t.axes.iter().enumerate() {
            let Some(s) = &a.semantic else { continue };
            let len = *layout.sizes.get(s).ok_or_else(|| RuntimeError::Blocks {
                feature: name.clone(),
                message: format!("the layout has no length for `{s}`"),
            })? as i64;
            y = match positions.get(s) {
                Some(pos) => y.f_index_select(d as i64, pos),
                None => y.f_narrow(d as i64, 0, len),
            }
            .feature(name)?;
        }
        if let Remap::ToPaddedLayout { of, .. } | Remap::ShardLocal { of, .. } = &t.remap {
            if let (Some(pos), Some(&padded_len)) = (positions.get(of), layout.padded.get(of)) {
                // Inverse of the position map; pads map to -1 and are caught below.
                let inverse = Tensor::f_full([padded_len as i64], -1, (Kind::Int64, Device::Cpu))
                    .and_then(|mut inv| {
                        let items = Tensor::f_arange(pos.size()[0], (Kind::Int64, Device::Cpu))?;
                        let _ = inv.f_index_copy_(0, pos, &items)?;
                        Ok(inv)
                    })
                    .feature(name)?;
                let flat = y
                    .f_flatten(0, -1)
                    .and_then(|f| f.f_to_kind(Kind::Int64))
                    .feature(name)?;
                let serial = inverse.f_index_select(0, &flat).feature(name)?;
                if serial.numel() > 0
                    && serial
                        .f_min()
                        .and_then(|m| m.f_int64_value(&[]))
                        .feature(name)?
                        < 0
                {
                    return Err(RuntimeError::Blocks {
                        feature: name.clone(),
                        message: format!("an index points at a pad position of `{of}`"),
                    });
                }
                y = serial
                    .f_view(y.size().as_slice())
                    .and_then(|v| v.f_to_kind(x.kind()))
                    .feature(name)?;
            }
        }
        out.insert(name.clone(), y.f_contiguous().feature(name)?);
    }
    Ok(out)
}
