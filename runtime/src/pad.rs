//! Padding: one serial sample -> the global padded layout of a mesh, and back.
//!
//! Each feature is written once: a tensor of its padded shape is filled with the pad
//! value and the serial values are copied into it (`index_copy_` along an
//! owner-partitioned axis, a plain copy into a narrowed view otherwise).

use std::collections::BTreeMap;

use featshard_spec::infer::CP_AXES;
use featshard_spec::ir::PadValue;
use featshard_spec::ir::Role;
use featshard_spec::plan::{FeatureShapes, Plan, Remap, SampleLayout, TensorPlan};
use tch::{Device, Kind, Tensor};

use crate::error::{RuntimeError, TorchContext};
use crate::kind::scalar;
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
        let out = pad_feature(
            plan,
            name,
            &features[name],
            &layout,
            &shapes[name],
            &positions,
        )?;
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

/// One feature in the plan's padded layout (index values remapped, diagonal checked).
pub(crate) fn pad_feature(
    plan: &Plan,
    name: &str,
    x: &Tensor,
    layout: &SampleLayout,
    shapes: &FeatureShapes,
    positions: &BTreeMap<String, Tensor>,
) -> Result<Tensor, RuntimeError> {
    let t = tensor_plan(plan, name)?;
    let x = remap_to_padded(name, t, x, positions)?;
    let out = write_padded(name, &x, t.pad_value, &plan_axes(t, shapes, layout))?;
    check_diagonal(name, t, &out, layout)?;
    Ok(out)
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

/// A stretch of consecutive items copied as one: serial `src..src+len` lands at
/// padded `dst..dst+len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    src: i64,
    dst: i64,
    len: i64,
}

/// More block copies than this per feature and the copy falls back to `index_copy_`.
const MAX_RUN_COPIES: usize = 4096;

/// The runs of one axis: one for an end-padded axis, one per owner block (when items
/// are in owner order, as counts give them) for an owner-partitioned axis.
fn runs_of(positions: Option<&[usize]>, len: usize) -> Vec<Run> {
    let Some(pos) = positions else {
        return vec![Run {
            src: 0,
            dst: 0,
            len: len as i64,
        }];
    };
    let mut runs: Vec<Run> = Vec::new();
    for (i, &p) in pos.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if r.src + r.len == i as i64 && r.dst + r.len == p as i64 => r.len += 1,
            _ => runs.push(Run {
                src: i as i64,
                dst: p as i64,
                len: 1,
            }),
        }
    }
    runs
}

/// The pad ranges `(start, len)` of an axis: everything its runs do not cover.
fn gaps(runs: &[Run], padded: i64) -> Vec<(i64, i64)> {
    let mut covered: Vec<(i64, i64)> = runs.iter().map(|r| (r.dst, r.dst + r.len)).collect();
    covered.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0;
    for (a, b) in covered {
        if a > at {
            out.push((at, a - at));
        }
        at = at.max(b);
    }
    if at < padded {
        out.push((at, padded - at));
    }
    out
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

/// Where one axis' serial items go in the padded tensor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AxisMap<'a> {
    pub padded: i64,
    /// Position of every item; `None`: items keep their place and the end is padded.
    pub positions: Option<&'a [usize]>,
}

/// The axis maps of a feature under the plan's layout.
fn plan_axes<'a>(
    t: &TensorPlan,
    shapes: &FeatureShapes,
    layout: &'a SampleLayout,
) -> Vec<AxisMap<'a>> {
    t.axes
        .iter()
        .zip(&shapes.padded_shape)
        .map(|(a, &padded)| AxisMap {
            padded: padded as i64,
            positions: a
                .semantic
                .as_ref()
                .and_then(|s| layout.positions.get(s))
                .map(Vec::as_slice),
        })
        .collect()
}

/// Writes `x` in a padded layout with one pass over its bytes: serial data is copied
/// block by block into an uninitialised tensor, then only the pad regions are filled.
pub(crate) fn write_padded(
    name: &str,
    x: &Tensor,
    pad: PadValue,
    axes: &[AxisMap],
) -> Result<Tensor, RuntimeError> {
    let padded: Vec<i64> = axes.iter().map(|a| a.padded).collect();
    let axis_runs: Vec<Vec<Run>> = axes
        .iter()
        .zip(x.size())
        .map(|(a, len)| runs_of(a.positions, len as usize))
        .collect();
    let copies: usize = axis_runs.iter().map(Vec::len).product();
    if copies > MAX_RUN_COPIES {
        return pad_by_index(name, x, pad, axes);
    }
    let out = Tensor::f_empty(padded.as_slice(), (x.kind(), x.device())).feature(name)?;
    // Every combination of one run per axis is one rectangular block copy.
    let counts: Vec<usize> = axis_runs.iter().map(Vec::len).collect();
    for_each_combination(&counts, |pick| {
        let (mut src, mut dst) = (x.shallow_clone(), out.shallow_clone());
        for (d, (runs, &k)) in axis_runs.iter().zip(pick).enumerate() {
            let r = runs[k];
            if r.len == 0 {
                return Ok(());
            }
            src = src.f_narrow(d as i64, r.src, r.len).feature(name)?;
            dst = dst.f_narrow(d as i64, r.dst, r.len).feature(name)?;
        }
        dst.f_copy_(&src).feature(name)
    })?;
    for (d, runs) in axis_runs.iter().enumerate() {
        for (start, len) in gaps(runs, padded[d]) {
            let _ = out
                .f_narrow(d as i64, start, len)
                .and_then(|mut region| region.f_fill_(scalar(pad)))
                .feature(name)?;
        }
    }
    Ok(out)
}

/// Calls `f` with every index combination `pick[d] < counts[d]` (none if any count is 0).
fn for_each_combination<E>(
    counts: &[usize],
    mut f: impl FnMut(&[usize]) -> Result<(), E>,
) -> Result<(), E> {
    if counts.contains(&0) {
        return Ok(());
    }
    let mut pick = vec![0usize; counts.len()];
    loop {
        f(&pick)?;
        let Some(d) = (0..pick.len()).rev().find(|&d| pick[d] + 1 < counts[d]) else {
            return Ok(());
        };
        pick[d] += 1;
        pick[d + 1..].fill(0);
    }
}

/// The general path, for axes whose items are scattered (an owner map out of owner
/// order): `index_copy_` along each axis with positions.
fn pad_by_index(
    name: &str,
    x: &Tensor,
    pad: PadValue,
    axes: &[AxisMap],
) -> Result<Tensor, RuntimeError> {
    let padded: Vec<i64> = axes.iter().map(|a| a.padded).collect();
    let out =
        Tensor::f_full(padded.as_slice(), scalar(pad), (x.kind(), x.device())).feature(name)?;
    let owned: Vec<(usize, Tensor)> = axes
        .iter()
        .enumerate()
        .filter_map(|(d, a)| {
            let p: Vec<i64> = a.positions?.iter().map(|&v| v as i64).collect();
            Some((d, Tensor::from_slice(&p)))
        })
        .collect();
    let mut src = x.shallow_clone();
    // With several owned axes, all but the last are scattered into intermediates.
    for (d, pos) in owned.iter().take(owned.len().saturating_sub(1)) {
        let mut shape = src.size();
        shape[*d] = padded[*d];
        let mut tmp = Tensor::f_full(shape.as_slice(), scalar(pad), (src.kind(), src.device()))
            .feature(name)?;
        let _ = tmp.f_index_copy_(*d as i64, pos, &src).feature(name)?;
        src = tmp;
    }
    let last_owned = owned.last().map(|(o, _)| *o);
    let mut view = out.shallow_clone();
    for (d, &n) in src.size().iter().enumerate() {
        if Some(d) != last_owned && n != padded[d] {
            view = view.f_narrow(d as i64, 0, n).feature(name)?;
        }
    }
    match owned.last() {
        Some((d, pos)) => {
            let _ = view.f_index_copy_(*d as i64, pos, &src).feature(name)?;
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
        // One-hot values are 0/1 (checked), so a sum counts the ones without a
        // temporary the size of the tensor; other features compare with the pad value.
        let one_hot = matches!(&t.role, Role::Index(ix) if ix.one_hot.is_some());
        let count = |x: &Tensor| -> Result<i64, RuntimeError> {
            let s = if one_hot {
                x.f_sum(Kind::Int64)
            } else {
                x.f_ne(scalar(t.pad_value))
                    .and_then(|ne| ne.f_sum(Kind::Int64))
            };
            s.and_then(|s| s.f_int64_value(&[])).feature(name)
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

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "\
version: 1
module: t
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true}
  atoms: {shard: true, owner: tokens, counts: counts}
features:
  counts: {axes: [tokens], dtype: int64}
  pair: {axes: [atoms, 2, atoms], dtype: float32, pad: -1.0}
";

    #[test]
    fn block_copies_and_index_copies_give_the_same_padded_tensor() {
        let (_, plan) = featshard_spec::compile_str("t.yaml", SPEC).expect("spec");
        let counts = [2i64, 0, 3, 1, 4];
        let a: i64 = counts.iter().sum();
        let x = Tensor::rand([a, 2, a], (Kind::Float, Device::Cpu));
        let features: Features = [
            ("counts".to_owned(), Tensor::from_slice(&counts)),
            ("pair".to_owned(), x.shallow_clone()),
        ]
        .into();
        let padded = pad(&plan, [2, 3], &features, &Options::default()).expect("pad");
        let t = tensor_plan(&plan, "pair").expect("pair");
        let axes = plan_axes(t, &padded.shapes["pair"], &padded.layout);
        let by_index = pad_by_index("pair", &x, t.pad_value, &axes).expect("index path");
        assert!(padded.tensors["pair"].equal(&by_index));
        // Pads hold the pad value, real entries the serial ones.
        let real =
            padded.layout.positions["atoms"].len() * 2 * padded.layout.positions["atoms"].len();
        let pads = by_index.eq(-1.0).sum(Kind::Int64).int64_value(&[]) as usize;
        assert_eq!(pads + real, by_index.numel());
    }

    #[test]
    fn runs_follow_consecutive_positions_and_gaps_cover_the_rest() {
        let runs = runs_of(Some(&[0, 1, 4, 5, 6, 9]), 6);
        assert_eq!(
            runs,
            vec![
                Run {
                    src: 0,
                    dst: 0,
                    len: 2
                },
                Run {
                    src: 2,
                    dst: 4,
                    len: 3
                },
                Run {
                    src: 5,
                    dst: 9,
                    len: 1
                }
            ]
        );
        assert_eq!(gaps(&runs, 12), vec![(2, 2), (7, 2), (10, 2)]);
        assert_eq!(gaps(&runs_of(None, 0), 3), vec![(0, 3)]);
    }
}
