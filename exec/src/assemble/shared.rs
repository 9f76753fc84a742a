//! What both ways back share: the features rank 0 holds, a rank's block checked and its
//! shard-local ids shifted back, the serial item at each padded position, ids made
//! serial, the order ranks come in, and fallible pad-filled layouts. Both assemblers
//! import it; it imports neither.

use std::collections::BTreeMap;

use featshard_spec::ir::DeriveRule;
use featshard_spec::plan::{FeatureShapes, Plan, SampleLayout, TensorPlan};

use crate::dense::Dense;
use crate::dtype;
use crate::error::ExecError;
use crate::feature::tensor_plan;
use crate::files::Sample;
use crate::local_ids::{self, Direction};

pub(crate) fn blocks_error(feature: &str, message: String) -> ExecError {
    ExecError::Blocks {
        feature: feature.to_owned(),
        message,
    }
}

/// A way back that takes one rank's blocks at a time, in rank order: the padded
/// layouts ([`Assembler`]) or the serial sample ([`SerialAssembler`]).
pub trait RankByRank {
    /// Rank `rank`'s blocks copied in (ranks come in order, each once).
    fn add(&mut self, rank: usize, blocks: &Sample) -> Result<(), ExecError>;
    /// The features, once every rank was added.
    fn finish(self: Box<Self>) -> Result<BTreeMap<String, Dense>, ExecError>;
}

/// The order ranks come in: each once, in rank order, all of them by the end.
#[derive(Debug)]
pub(super) struct Turns {
    pub(super) next: usize,
}

impl Turns {
    pub(super) fn take(
        &mut self,
        plan: &Plan,
        layout: &SampleLayout,
        rank: usize,
    ) -> Result<(), ExecError> {
        if rank != self.next || rank >= layout.mesh.ranks() {
            return Err(ExecError::NoSuchRank {
                rank,
                mesh: plan.mesh.named(layout.mesh),
            });
        }
        self.next += 1;
        Ok(())
    }

    pub(super) fn done(&self, plan: &Plan, layout: &SampleLayout) -> Result<(), ExecError> {
        match self.next == layout.mesh.ranks() {
            true => Ok(()),
            false => Err(ExecError::RankCount {
                what: "ranks' blocks",
                given: self.next,
                mesh: plan.mesh.named(layout.mesh),
            }),
        }
    }
}

/// `numel` pad values of `t`, allocated fallibly: a layout past what the machine can
/// give is an error naming the feature, never an abort.
pub(super) fn pad_filled(name: &str, t: &TensorPlan, numel: usize) -> Result<Vec<u8>, ExecError> {
    let pad = dtype::pad_bytes(t.dtype, t.pad_value);
    let what = format!("feature `{name}`'s assembled layout");
    let mut bytes = crate::alloc::with_capacity(&what, numel.saturating_mul(pad.len()), 1)?;
    for _ in 0..numel {
        bytes.extend_from_slice(&pad);
    }
    Ok(bytes)
}

/// The shapes of the features rank 0's blocks hold (optional ones may be absent), once
/// no required feature is missing.
pub(super) fn assembled_shapes(
    plan: &Plan,
    layout: &SampleLayout,
    workflow: Option<&str>,
    first: &Sample,
) -> Result<BTreeMap<String, FeatureShapes>, ExecError> {
    let wanted = plan.feature_names(workflow)?;
    let names = first
        .keys()
        .map(String::as_str)
        .filter(|n| wanted.contains(n));
    let shapes = plan.shapes_of(layout, names)?;
    for (name, t) in plan.tensors() {
        if wanted.contains(&name)
            && !t.optional
            && t.derived.is_none()
            && !shapes.contains_key(name)
        {
            return Err(blocks_error(name, "rank 0 has no block".into()));
        }
    }
    Ok(shapes)
}

/// Rank `r`'s block of one feature, checked against its plan, as bytes whose shard-local
/// ids are shifted back to the padded layout.
pub(super) fn padded_block(
    plan: &Plan,
    layout: &SampleLayout,
    name: &str,
    s: &FeatureShapes,
    r: usize,
    block: &crate::array::Array,
) -> Result<Vec<u8>, ExecError> {
    let t = tensor_plan(plan, name)?;
    if block.shape() != s.local_shape || block.dtype() != t.dtype {
        return Err(blocks_error(
            name,
            format!(
                "rank {r} holds {:?} {}, the plan says {:?} {}",
                block.shape(),
                block.dtype(),
                s.local_shape,
                t.dtype
            ),
        ));
    }
    let mut bytes = block.to_bytes();
    let coord = layout.mesh.coord(r);
    let direction = Direction::ToPadded;
    local_ids::shift(
        name,
        t,
        layout,
        &s.local_shape,
        coord,
        &mut bytes,
        direction,
    )?;
    Ok(bytes)
}

/// Which serial item lies at each padded position of one axis.
#[derive(Clone, Debug)]
pub(super) enum Items {
    /// Items `0..n` at positions `0..n` (a channel axis, a semantic padded at its end, a
    /// key halo's rows).
    Prefix(usize),
    /// `(position, item)` of every item, by position (items laid out in owner blocks or
    /// in windows); as long as the sample's items, never as the padded axis.
    At(Vec<(usize, usize)>),
}

impl Items {
    /// The items of semantic `s` in `layout`, whose padded axis is `padded` long.
    pub(super) fn of(
        name: &str,
        layout: &SampleLayout,
        s: &str,
        padded: usize,
    ) -> Result<Items, ExecError> {
        if let Some(pos) = layout.positions.get(s) {
            let mut at = crate::alloc::with_capacity(name, pos.len(), 16)?;
            at.extend(pos.iter().copied().zip(0..));
            at.sort_unstable();
            return Ok(Items::At(at));
        }
        let len = layout
            .sizes
            .get(s)
            .ok_or_else(|| blocks_error(name, format!("the layout has no length for `{s}`")))?;
        Ok(Items::Prefix((*len).min(padded)))
    }

    /// How many items.
    pub(super) fn len(&self) -> usize {
        match self {
            Items::Prefix(n) => *n,
            Items::At(at) => at.len(),
        }
    }

    /// The item at padded position `p` (`None` at a pad).
    pub(super) fn at(&self, p: usize) -> Option<usize> {
        match self {
            Items::Prefix(n) => (p < *n).then_some(p),
            Items::At(at) => at
                .binary_search_by_key(&p, |&(q, _)| q)
                .ok()
                .map(|k| at[k].1),
        }
    }

    /// `(offset in the window, item)` of every item in the window `start..start + len`.
    pub(super) fn in_window(&self, start: usize, len: usize) -> Vec<(usize, usize)> {
        let end = start.saturating_add(len);
        match self {
            Items::Prefix(n) => (start..end.min(*n)).map(|p| (p - start, p)).collect(),
            Items::At(at) => {
                let first = at.partition_point(|&(q, _)| q < start);
                at[first..]
                    .iter()
                    .take_while(|&&(q, _)| q < end)
                    .map(|&(q, item)| (q - start, item))
                    .collect()
            }
        }
    }
}

/// The items along every axis of feature `t`: a semantic's, a channel's all, a key
/// halo's all (its serial form is its laid-out one).
pub(super) fn axis_items(
    name: &str,
    t: &TensorPlan,
    layout: &SampleLayout,
    s: &FeatureShapes,
) -> Result<Vec<Items>, ExecError> {
    let halo = t.derived.as_ref().and_then(DeriveRule::halo).is_some();
    t.axes
        .iter()
        .zip(&s.padded_shape)
        .map(|(a, &n)| match &a.semantic {
            Some(sem) if !halo => Items::of(name, layout, sem, n),
            _ => Ok(Items::Prefix(n)),
        })
        .collect()
}

/// Index values into the padded layout of `of` back to serial item numbers, the none
/// value kept; a value at a pad position, or outside the layout, is an error.
pub(super) fn to_serial_ids(
    name: &str,
    of: &str,
    layout: &SampleLayout,
    none: Option<i64>,
    y: &mut Dense,
) -> Result<(), ExecError> {
    let (true, Some(&padded)) = (layout.positions.contains_key(of), layout.padded.get(of)) else {
        return Ok(());
    };
    // The items by position, as long as the sample's (never as the padded axis).
    let items = Items::of(name, layout, of, padded)?;
    let es = dtype::size(y.dtype);
    let mut out = Vec::with_capacity(y.bytes.len());
    for v in y.bytes.chunks_exact(es) {
        let g = dtype::read_i64(y.dtype, v);
        let serial = usize::try_from(g).ok().and_then(|g| items.at(g));
        match serial {
            _ if Some(g) == none => dtype::encode_i64(y.dtype, g, &mut out),
            Some(s) => dtype::encode_i64(y.dtype, s as i64, &mut out),
            _ => {
                return Err(blocks_error(
                    name,
                    format!("an index points at a pad position of `{of}`"),
                ))
            }
        }
    }
    y.bytes = out;
    Ok(())
}
