//! Padding: one serial sample -> the global padded layout of a mesh, and back.
//!
//! A sample is first [`place`]d: validated, laid out, index values moved to the padded
//! layout and block-diagonal features checked, nothing copied. Any rectangular window of
//! a feature's padded layout is then written in one pass over its bytes: the serial
//! blocks that land in it are copied, only the pad regions are filled. The padded global
//! tensor is the whole window; a rank's block, written straight into a send buffer,
//! is its part of it.

use std::collections::BTreeMap;

use featshard_spec::ir::PadValue;
use featshard_spec::plan::CP_AXES;
use featshard_spec::plan::{FeatureShapes, Plan, SampleLayout, TensorPlan};
use tch::Tensor;

use crate::error::{RuntimeError, TorchContext};
use crate::kind::scalar;
use crate::sample::{handles, tensor_plan, Features, Options};
use crate::views::{tensor, view, views};

/// One sample in the padded global layout of one mesh.
#[derive(Debug)]
pub struct Padded {
    /// Padded lengths and owner-block positions.
    pub layout: SampleLayout,
    /// Every tensor feature's shapes.
    pub shapes: BTreeMap<String, FeatureShapes>,
    /// Every tensor feature at its padded shape.
    pub tensors: BTreeMap<String, Tensor>,
    /// Features carried along untouched.
    pub passthrough: BTreeMap<String, Tensor>,
    /// What intake did to the sample as emitted (incoming pads, dropped keys).
    pub intake: IntakeReport,
}

/// A validated sample placed on one mesh, not yet padded.
#[derive(Debug)]
pub struct Placed {
    /// Padded lengths and owner-block positions.
    pub layout: SampleLayout,
    /// Every tensor feature's shapes.
    pub shapes: BTreeMap<String, FeatureShapes>,
    /// Every tensor feature at its serial shape, index values already in the padded
    /// layout (one-hot maps are moved by their axes instead).
    pub tensors: BTreeMap<String, Tensor>,
    /// Features carried along untouched.
    pub passthrough: BTreeMap<String, Tensor>,
    /// What intake did to the sample as emitted (incoming pads, dropped keys).
    pub intake: IntakeReport,
}

pub use featshard_exec::IntakeReport;

/// Validates a serial sample and pads it for `mesh`.
pub fn pad(
    plan: &Plan,
    mesh: [usize; CP_AXES],
    features: &Features,
    opts: &Options,
) -> Result<Padded, RuntimeError> {
    place(plan, mesh, features, opts)?.into_padded(plan)
}

/// Validates a serial sample and places it on `mesh`: layout, shapes, index values
/// remapped, nothing outside the diagonal blocks of co-sharded features. The rules run
/// in the byte executor on views of the tensors; their result comes back as tensors.
pub fn place(
    plan: &Plan,
    mesh: [usize; CP_AXES],
    features: &Features,
    opts: &Options,
) -> Result<Placed, RuntimeError> {
    let seen = views(plan, features)?;
    let placed = featshard_exec::place(plan, mesh, &seen, opts)?;
    let tensors = placed
        .arrays
        .iter()
        .map(|(n, a)| Ok((n.clone(), tensor(n, a, features.get(n).zip(seen.get(n)))?)))
        .collect::<Result<_, RuntimeError>>()?;
    let passthrough = placed
        .passthrough
        .keys()
        .map(|n| (n.clone(), features[n].shallow_clone()))
        .collect();
    Ok(Placed {
        layout: placed.layout,
        shapes: placed.shapes,
        tensors,
        passthrough,
        intake: placed.intake,
    })
}

impl Placed {
    /// Another handle on the same tensors (tensors are `Send`, not `Sync`: each thread
    /// writing blocks holds its own).
    pub fn shallow_clone(&self) -> Placed {
        Placed {
            layout: self.layout.clone(),
            shapes: self.shapes.clone(),
            tensors: handles(&self.tensors),
            passthrough: handles(&self.passthrough),
            intake: self.intake.clone(),
        }
    }

    /// A tensor feature and its shapes.
    pub(crate) fn feature(&self, name: &str) -> Result<(&Tensor, &FeatureShapes), RuntimeError> {
        match (self.tensors.get(name), self.shapes.get(name)) {
            (Some(x), Some(s)) => Ok((x, s)),
            _ => Err(RuntimeError::Missing {
                feature: name.to_owned(),
            }),
        }
    }

    /// One feature at its padded global shape, in a new tensor.
    pub fn padded(&self, plan: &Plan, name: &str) -> Result<Tensor, RuntimeError> {
        let t = tensor_plan(plan, name)?;
        let (x, shapes) = self.feature(name)?;
        write_padded(name, x, t.pad_value, &plan_axes(t, shapes, &self.layout))
    }

    /// One feature's region `window` (`(start, len)` per axis of its padded shape)
    /// written into `out`, a tensor (or view) of the window's shape.
    pub fn write_window(
        &self,
        plan: &Plan,
        name: &str,
        window: &[(i64, i64)],
        out: &Tensor,
    ) -> Result<(), RuntimeError> {
        let t = tensor_plan(plan, name)?;
        let (x, shapes) = self.feature(name)?;
        let axes = plan_axes(t, shapes, &self.layout);
        let fits = window.len() == axes.len()
            && window
                .iter()
                .zip(&axes)
                .all(|(&(start, len), a)| start >= 0 && len >= 0 && start + len <= a.padded);
        let want: Vec<i64> = window.iter().map(|w| w.1).collect();
        if !fits || out.size() != want || out.kind() != x.kind() {
            return Err(RuntimeError::Blocks {
                feature: name.to_owned(),
                message: format!(
                    "window {window:?} of padded shape {:?} ({:?}) written into a {:?} tensor of shape {:?}",
                    shapes.padded_shape,
                    x.kind(),
                    out.kind(),
                    out.size()
                ),
            });
        }
        write_window(name, x, t.pad_value, &axes, window, out)
    }

    /// Every feature padded, in new tensors.
    pub fn into_padded(self, plan: &Plan) -> Result<Padded, RuntimeError> {
        let tensors = self
            .tensors
            .keys()
            .map(|n| Ok((n.clone(), self.padded(plan, n)?)))
            .collect::<Result<_, RuntimeError>>()?;
        Ok(Padded {
            layout: self.layout,
            shapes: self.shapes,
            tensors,
            passthrough: self.passthrough,
            intake: self.intake,
        })
    }
}

/// One feature in the plan's padded layout (index values remapped, diagonal checked).
pub(crate) fn pad_feature(
    plan: &Plan,
    name: &str,
    x: &Tensor,
    layout: &SampleLayout,
    shapes: &FeatureShapes,
) -> Result<Tensor, RuntimeError> {
    let t = tensor_plan(plan, name)?;
    let seen = view(plan, name, x)?;
    let placed = featshard_exec::place::place_feature(plan, name, &seen, layout, shapes)?;
    let x = tensor(name, &placed, Some((x, &seen)))?;
    write_padded(name, &x, t.pad_value, &plan_axes(t, shapes, layout))
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
    featshard_exec::place::axis_maps(t, shapes, layout)
        .into_iter()
        .map(|a| AxisMap {
            padded: a.padded as i64,
            positions: a.positions,
        })
        .collect()
}

/// `x` in a padded layout, in a new tensor.
pub(crate) fn write_padded(
    name: &str,
    x: &Tensor,
    pad: PadValue,
    axes: &[AxisMap],
) -> Result<Tensor, RuntimeError> {
    let padded: Vec<i64> = axes.iter().map(|a| a.padded).collect();
    let out = Tensor::f_empty(padded.as_slice(), (x.kind(), x.device())).feature(name)?;
    let window: Vec<(i64, i64)> = padded.iter().map(|&n| (0, n)).collect();
    write_window(name, x, pad, axes, &window, &out)?;
    Ok(out)
}

/// The runs of one axis that land in `window` (`(start, len)` of the padded axis), with
/// destinations relative to the window's start.
fn window_runs(axis: &AxisMap, len: usize, (start, wlen): (i64, i64)) -> Vec<Run> {
    runs_of(axis.positions, len)
        .into_iter()
        .filter_map(|r| {
            let from = r.dst.max(start);
            let to = (r.dst + r.len).min(start + wlen);
            (from < to).then(|| Run {
                src: r.src + (from - r.dst),
                dst: from - start,
                len: to - from,
            })
        })
        .collect()
}

/// Writes the region `window` of `x`'s padded layout into `out` (of the window's
/// shape) with one pass over its bytes: serial data is copied block by block, then
/// only the pad regions are filled.
fn write_window(
    name: &str,
    x: &Tensor,
    pad: PadValue,
    axes: &[AxisMap],
    window: &[(i64, i64)],
    out: &Tensor,
) -> Result<(), RuntimeError> {
    let axis_runs: Vec<Vec<Run>> = axes
        .iter()
        .zip(x.size())
        .zip(window)
        .map(|((a, len), &w)| window_runs(a, len as usize, w))
        .collect();
    let copies: usize = axis_runs.iter().map(Vec::len).product();
    if copies > MAX_RUN_COPIES {
        return write_by_index(name, x, pad, &axis_runs, out);
    }
    // Every combination of one run per axis is one rectangular block copy.
    let counts: Vec<usize> = axis_runs.iter().map(Vec::len).collect();
    for_each_combination(&counts, |pick| {
        let (mut src, mut dst) = (x.shallow_clone(), out.shallow_clone());
        for (d, (runs, &k)) in axis_runs.iter().zip(pick).enumerate() {
            let r = runs[k];
            src = src.f_narrow(d as i64, r.src, r.len).feature(name)?;
            dst = dst.f_narrow(d as i64, r.dst, r.len).feature(name)?;
        }
        dst.f_copy_(&src).feature(name)
    })?;
    for (d, runs) in axis_runs.iter().enumerate() {
        for (start, len) in gaps(runs, window[d].1) {
            let _ = out
                .f_narrow(d as i64, start, len)
                .and_then(|mut region| region.f_fill_(scalar(pad)))
                .feature(name)?;
        }
    }
    Ok(())
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

/// The source (or destination) indices of runs, in run order.
fn run_indices(runs: &[Run], dst: bool) -> Tensor {
    let idx: Vec<i64> = runs
        .iter()
        .flat_map(|r| {
            let start = if dst { r.dst } else { r.src };
            start..start + r.len
        })
        .collect();
    Tensor::from_slice(&idx)
}

/// The general path of [`write_window`], for axes whose items are scattered into many
/// runs (an owner map out of owner order): the items landing in the window are
/// selected, then `index_copy_`d along each such axis.
fn write_by_index(
    name: &str,
    x: &Tensor,
    pad: PadValue,
    axis_runs: &[Vec<Run>],
    out: &Tensor,
) -> Result<(), RuntimeError> {
    let _ = out.shallow_clone().f_fill_(scalar(pad)).feature(name)?;
    if axis_runs.iter().any(Vec::is_empty) {
        return Ok(());
    }
    let (mut src, mut dst) = (x.shallow_clone(), out.shallow_clone());
    let mut scattered = Vec::new();
    for (d, runs) in axis_runs.iter().enumerate() {
        let d64 = d as i64;
        if let [r] = runs.as_slice() {
            src = src.f_narrow(d64, r.src, r.len).feature(name)?;
            dst = dst.f_narrow(d64, r.dst, r.len).feature(name)?;
        } else {
            src = src
                .f_index_select(d64, &run_indices(runs, false))
                .feature(name)?;
            scattered.push((d64, run_indices(runs, true)));
        }
    }
    // With several scattered axes, all but the last go through intermediates.
    let last = scattered.pop();
    for (d, pos) in scattered {
        let mut shape = src.size();
        shape[d as usize] = dst.size()[d as usize];
        let mut tmp = Tensor::f_full(shape.as_slice(), scalar(pad), (src.kind(), src.device()))
            .feature(name)?;
        let _ = tmp.f_index_copy_(d, &pos, &src).feature(name)?;
        src = tmp;
    }
    match last {
        Some((d, pos)) => dst.f_index_copy_(d, &pos, &src).map(|_| ()),
        None => dst.f_copy_(&src),
    }
    .feature(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::{assemble, coords, unpad};
    use tch::{Device, Kind};

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
    fn padding_a_counts_sample_puts_serial_values_at_their_positions() {
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
        let out = &padded.tensors["pair"];
        let pos = &position_tensors(&padded.layout)["atoms"];
        let back = out.index_select(0, pos).index_select(2, pos);
        assert!(back.equal(&x));
        // Everything else is the pad value.
        let pads = out.eq(-1.0).sum(Kind::Int64).int64_value(&[]);
        assert_eq!(pads as usize + x.numel(), out.numel());
    }

    /// Windows of a padded axis of length `n`: whole, halves, a middle third, the
    /// last item, an empty one.
    fn windows(n: i64) -> Vec<(i64, i64)> {
        vec![
            (0, n),
            (0, n / 2),
            (n / 2, n - n / 2),
            (n / 3, n / 3),
            (n - 1, 1),
            (2, 0),
        ]
    }

    #[test]
    fn every_window_is_the_same_by_runs_by_index_and_as_a_view_of_the_padded_tensor() {
        // An owner-ordered axis (a run per block), an end-padded one, and a scattered
        // one (a run per item).
        let ordered = [0usize, 1, 2, 4, 5, 8];
        let scattered = [7usize, 0, 3, 9, 4, 1];
        let axes = [
            AxisMap {
                padded: 10,
                positions: Some(&ordered),
            },
            AxisMap {
                padded: 3,
                positions: None,
            },
            AxisMap {
                padded: 10,
                positions: Some(&scattered),
            },
        ];
        let x = Tensor::rand([6, 2, 6], (Kind::Float, Device::Cpu));
        let pad = PadValue::Float(-1.0);
        let full = write_padded("x", &x, pad, &axes).expect("padded");
        let back = full
            .index_select(0, &Tensor::from_slice(&[0i64, 1, 2, 4, 5, 8]))
            .narrow(1, 0, 2)
            .index_select(2, &Tensor::from_slice(&[7i64, 0, 3, 9, 4, 1]));
        assert!(back.equal(&x));
        let mut checked = 0;
        for w0 in windows(10) {
            for w1 in windows(3) {
                for w2 in windows(10) {
                    let window = [w0, w1, w2];
                    let view = full
                        .narrow(0, w0.0, w0.1)
                        .narrow(1, w1.0, w1.1)
                        .narrow(2, w2.0, w2.1);
                    let by_runs = Tensor::full([w0.1, w1.1, w2.1], 7.0, (Kind::Float, Device::Cpu));
                    write_window("x", &x, pad, &axes, &window, &by_runs).expect("runs");
                    assert!(by_runs.equal(&view), "runs, window {window:?}");
                    let runs: Vec<Vec<Run>> = axes
                        .iter()
                        .zip(x.size())
                        .zip(window)
                        .map(|((a, len), w)| window_runs(a, len as usize, w))
                        .collect();
                    let by_index = by_runs.full_like(7.0);
                    write_by_index("x", &x, pad, &runs, &by_index).expect("index");
                    assert!(by_index.equal(&view), "index, window {window:?}");
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 6 * 6 * 6);
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

    /// A shard-local index vector (the owner token of each atom, as an id on the shard
    /// holding the atom): blocks viewed from the padded tensor and blocks written straight
    /// from the serial sample hold the same local ids, and both assemble back.
    #[test]
    fn shard_local_ids_are_local_in_viewed_and_written_blocks() {
        let spec = format!(
            "{SPEC}  owner: {{axes: [atoms], dtype: int64, pad: -1, index: {{of: tokens, scope: shard_local}}}}\n"
        );
        let (_, plan) = featshard_spec::compile_str("t.yaml", &spec).expect("spec");
        let counts = [2i64, 0, 3, 1, 4, 0, 2];
        let owner: Vec<i64> = counts
            .iter()
            .enumerate()
            .flat_map(|(t, &c)| std::iter::repeat_n(t as i64, c as usize))
            .collect();
        let a = owner.len() as i64;
        let sample: Features = [
            ("counts".to_owned(), Tensor::from_slice(&counts)),
            ("owner".to_owned(), Tensor::from_slice(&owner)),
            (
                "pair".to_owned(),
                Tensor::rand([a, 2, a], (Kind::Float, Device::Cpu)),
            ),
        ]
        .into();
        for mesh in [[2, 1], [3, 2], [4, 1]] {
            let padded = pad(&plan, mesh, &sample, &Options::default()).expect("pad");
            let placed = place(&plan, mesh, &sample, &Options::default()).expect("place");
            let layout = &padded.layout;
            let (n_loc, a_loc) = (
                (layout.padded["tokens"] / mesh[0]) as i64,
                (layout.padded["atoms"] / mesh[0]) as i64,
            );
            let mut ranks = Vec::new();
            for rank in 0..mesh[0] * mesh[1] {
                let coord = coords(mesh, rank);
                let viewed = padded.block(&plan, "owner", coord).expect("block").tensor;
                let mut written = viewed.full_like(7);
                placed
                    .write_block(&plan, "owner", coord, &mut written)
                    .expect("write");
                assert!(written.equal(&viewed), "mesh {mesh:?} rank {rank}");
                // Every real atom's id is its owner's padded position minus the shard start.
                for row in 0..a_loc {
                    let p = coord[0] as i64 * a_loc + row;
                    let local = written.int64_value(&[row]);
                    match layout.positions["atoms"]
                        .iter()
                        .position(|&q| q as i64 == p)
                    {
                        Some(atom) => {
                            // Tokens are end-padded: a token's padded position is its index.
                            let token = owner[atom];
                            assert_eq!(local, token - coord[0] as i64 * n_loc, "atom {atom}");
                            assert!((0..n_loc).contains(&local));
                        }
                        None => assert_eq!(local, -1, "pad at {p}"),
                    }
                }
                let mut blocks: Features = padded
                    .rank_blocks(&plan, rank)
                    .expect("blocks")
                    .into_iter()
                    .map(|(n, b)| (n, b.tensor))
                    .collect();
                blocks.insert("owner".into(), written);
                ranks.push(blocks);
            }
            let assembled = assemble(&plan, layout, None, &ranks).expect("assemble");
            let serial = unpad(&plan, layout, &assembled).expect("unpad");
            assert!(serial["owner"].equal(&sample["owner"]), "mesh {mesh:?}");
        }
    }
}
