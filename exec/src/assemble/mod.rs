//! The way back, on bytes: every rank's blocks into each feature's padded global
//! layout (shard-local ids shifted back, replicated copies required equal), and the
//! padded layout back to the serial sample (pads dropped, owner-partitioned items back
//! in serial order, padded-layout indices back to serial ones). What `featshard
//! assemble` runs on, with no libtorch.

use std::collections::BTreeMap;

use featshard_spec::ir::{DType, DeriveRule};
use featshard_spec::plan::{FeatureShapes, Plan, Remap, SampleLayout, TensorPlan};

use featshard_spec::shards::Encoding;

use crate::compact::{expand_stored, stored_entries, stored_form};
use crate::dtype;
use crate::error::ExecError;
use crate::feature::tensor_plan;
use crate::files::Sample;
use crate::local_ids::for_each_index;

mod serial;
mod shared;

pub use crate::dense::Dense;
pub use serial::SerialAssembler;
pub(crate) use shared::blocks_error;
pub use shared::RankByRank;
use shared::{assembled_shapes, axis_items, pad_filled, padded_block, to_serial_ids, Items, Turns};

/// Every rank's blocks (rank-ordered, `mesh[0] * mesh[1]` of them) back into the padded
/// global features of `workflow` they hold. Ranks holding the same region of a
/// replicated axis must hold the same bytes.
pub fn assemble(
    plan: &Plan,
    layout: &SampleLayout,
    workflow: Option<&str>,
    ranks: &[Sample],
) -> Result<BTreeMap<String, Dense>, ExecError> {
    let first = first_of(plan, layout, ranks)?;
    every_rank(
        Box::new(Assembler::new(plan, layout, workflow, first)?),
        ranks,
    )
}

/// Every rank's blocks straight back into the serial sample (what [`unpad`] of
/// [`assemble`] gives), through [`SerialAssembler`]: no padded global layout is made.
pub fn assemble_serial(
    plan: &Plan,
    layout: &SampleLayout,
    workflow: Option<&str>,
    ranks: &[Sample],
) -> Result<BTreeMap<String, Dense>, ExecError> {
    let first = first_of(plan, layout, ranks)?;
    every_rank(
        Box::new(SerialAssembler::new(plan, layout, workflow, first)?),
        ranks,
    )
}

/// Rank 0's blocks of a mesh's worth of ranks.
fn first_of<'s, 'a>(
    plan: &Plan,
    layout: &SampleLayout,
    ranks: &'s [Sample<'a>],
) -> Result<&'s Sample<'a>, ExecError> {
    match ranks.len() == layout.mesh.ranks() {
        true => Ok(&ranks[0]),
        false => Err(ExecError::RankCount {
            what: "ranks' blocks",
            given: ranks.len(),
            mesh: plan.mesh.named(layout.mesh),
        }),
    }
}

fn every_rank(
    mut into: Box<dyn RankByRank + '_>,
    ranks: &[Sample],
) -> Result<BTreeMap<String, Dense>, ExecError> {
    for (r, blocks) in ranks.iter().enumerate() {
        into.add(r, blocks)?;
    }
    into.finish()
}

/// [`assemble`] one rank at a time, so that a reader holds one rank's blocks beside the
/// padded global features (rank files of any mesh, one mapped at a time): the padded
/// layouts are made (pads filled) from the features rank 0 holds, every rank's blocks
/// are copied in as they come, in rank order.
#[derive(Debug)]
pub struct Assembler<'p> {
    plan: &'p Plan,
    layout: &'p SampleLayout,
    shapes: BTreeMap<String, FeatureShapes>,
    full: BTreeMap<String, Assembled>,
    turns: Turns,
}

/// One feature's padded global layout as the ranks fill it.
#[derive(Debug)]
struct Assembled {
    dense: Dense,
    /// The rank that wrote each region (keyed by its coordinates on split axes): a
    /// second copy of a replicated region must be equal.
    written: BTreeMap<Vec<usize>, usize>,
}

impl<'p> Assembler<'p> {
    /// The padded layouts of the features of `workflow` that rank 0's blocks `first`
    /// hold (every required one must be there).
    pub fn new(
        plan: &'p Plan,
        layout: &'p SampleLayout,
        workflow: Option<&str>,
        first: &Sample,
    ) -> Result<Self, ExecError> {
        let shapes = assembled_shapes(plan, layout, workflow, first)?;
        let mut full = BTreeMap::new();
        for (name, s) in &shapes {
            let t = tensor_plan(plan, name)?;
            let numel = s.padded_shape.iter().product::<usize>();
            let bytes = pad_filled(name, t, numel)?;
            let shape = s.padded_shape.clone();
            let dense = Dense {
                dtype: t.dtype,
                shape,
                bytes,
            };
            let written = BTreeMap::new();
            full.insert(name.clone(), Assembled { dense, written });
        }
        Ok(Assembler {
            plan,
            layout,
            shapes,
            full,
            turns: Turns { next: 0 },
        })
    }
}

impl RankByRank for Assembler<'_> {
    fn add(&mut self, rank: usize, blocks: &Sample) -> Result<(), ExecError> {
        self.turns.take(self.plan, self.layout, rank)?;
        for (name, s) in &self.shapes {
            let block = blocks
                .get(name)
                .ok_or_else(|| blocks_error(name, format!("rank {rank} has no block")))?;
            let Some(into) = self.full.get_mut(name) else {
                continue;
            };
            copy_block(self.plan, self.layout, name, s, rank, block, into)?;
        }
        Ok(())
    }

    /// The padded global features, once every rank was added.
    fn finish(self: Box<Self>) -> Result<BTreeMap<String, Dense>, ExecError> {
        self.turns.done(self.plan, self.layout)?;
        Ok(self.full.into_iter().map(|(n, a)| (n, a.dense)).collect())
    }
}

/// What assembling a feature holds, counted before anything is made from a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// The feature.
    pub feature: String,
    /// Bytes of its padded global layout (what the assembled file holds at most).
    pub global: u128,
    /// Bytes held in memory while assembling it: every rank's dense block and the
    /// padded global layout.
    pub held: u128,
    /// Bytes of its serial form (what the assembled serial file holds).
    pub serial: u128,
    /// Bytes held in memory while assembling it straight to its serial form
    /// ([`SerialAssembler`]): one rank's dense block and the serial feature.
    pub held_serial: u128,
}

/// The [`Footprint`] of every feature the ranks' blocks hold, largest first, counted
/// saturating: a folder of tiny compact blocks may describe a sample far larger than
/// memory, and is refused by its size, not by an allocation that aborts.
pub fn footprints(
    plan: &Plan,
    layout: &SampleLayout,
    ranks: &[Sample],
) -> Result<Vec<Footprint>, ExecError> {
    let world = layout.mesh.ranks() as u128;
    let present = plan
        .tensors()
        .map(|(n, _)| n)
        .filter(|n| ranks.iter().any(|r| r.contains_key(*n)));
    let bytes = |shape: &[usize], d: DType| {
        shape
            .iter()
            .fold(dtype::size(d) as u128, |a, &k| a.saturating_mul(k as u128))
    };
    let mut out = Vec::new();
    for (name, s) in plan.shapes_of(layout, present)? {
        let t = tensor_plan(plan, &name)?;
        let d = t.dtype;
        let global = bytes(&s.global_shape, d);
        let local = bytes(&s.local_shape, d);
        let held = local.saturating_mul(world).saturating_add(global);
        let serial_shape: Vec<usize> = axis_items(&name, t, layout, &s)?
            .iter()
            .map(Items::len)
            .collect();
        let serial = bytes(&serial_shape, d);
        out.push(Footprint {
            feature: name,
            global,
            held,
            serial,
            held_serial: local.saturating_add(serial),
        });
    }
    out.sort_by_key(|f| std::cmp::Reverse(f.held));
    Ok(out)
}

/// Rank blocks as rank files store them (`encoding`) made the dense blocks [`assemble`]
/// takes: a compact block expanded (see [`crate::compact::stored_form`]), others as
/// they are. A stored block that is not its feature's compact form is refused by name.
pub fn dense_blocks<'a>(
    plan: &Plan,
    layout: &SampleLayout,
    encoding: Encoding,
    ranks: Vec<Sample<'a>>,
) -> Result<Vec<Sample<'a>>, ExecError> {
    if encoding == Encoding::Dense {
        return Ok(ranks);
    }
    let names: Vec<&str> = plan.tensors().map(|(n, _)| n).collect();
    let present = names
        .into_iter()
        .filter(|n| ranks.iter().any(|r| r.contains_key(*n)));
    let shapes = plan.shapes_of(layout, present)?;
    ranks
        .into_iter()
        .map(|mut blocks| {
            for (name, s) in &shapes {
                let t = tensor_plan(plan, name)?;
                let Some(x) = blocks.get(name) else { continue };
                if stored_form(t, &s.local_shape, stored_entries(x)).is_some() {
                    let dense = expand_stored(name, t, &s.local_shape, x)?;
                    blocks.insert(name.clone(), dense);
                }
            }
            Ok(blocks)
        })
        .collect()
}

/// Rank `r`'s block of one feature copied into its padded global layout (shard-local
/// ids shifted back); a replicated region written before must be equal.
fn copy_block(
    plan: &Plan,
    layout: &SampleLayout,
    name: &str,
    s: &FeatureShapes,
    r: usize,
    block: &crate::array::Array,
    into: &mut Assembled,
) -> Result<(), ExecError> {
    let Assembled {
        dense: full,
        written,
    } = into;
    let t = tensor_plan(plan, name)?;
    let es = dtype::size(t.dtype);
    let coord = layout.mesh.coord(r);
    let bytes = padded_block(plan, layout, name, s, r, block)?;
    let window = t.block_window(&s.local_shape, coord);
    // The region a rank holds is identified by its coordinates on split axes.
    let key: Vec<usize> = t
        .axes
        .iter()
        .filter_map(|a| a.split.mesh_axis().map(|m| coord.get(m)))
        .collect();
    let region = Region::new(&full.shape, &window, es);
    match written.get(&key) {
        Some(&first) if !region.equals(&full.bytes, &bytes) => Err(blocks_error(
            name,
            format!("ranks {first} and {r} hold different copies of a replicated block"),
        )),
        Some(_) => Ok(()),
        None => {
            region.copy_in(&mut full.bytes, &bytes);
            written.insert(key, r);
            Ok(())
        }
    }
}

/// A box `(start, len)` per axis of a row-major tensor: its rows are contiguous runs.
struct Region {
    /// Byte offset of every row of the box in the tensor, in row-major order.
    rows: Vec<usize>,
    /// Bytes of one row (the box's last axis).
    row: usize,
}

impl Region {
    fn new(shape: &[usize], window: &[(usize, usize)], es: usize) -> Region {
        let stride = featshard_spec::layout::contiguous_stride(shape);
        let Some(((last_at, last_len), lead)) = window.split_last() else {
            return Region {
                rows: vec![0],
                row: es,
            };
        };
        let lens: Vec<usize> = lead.iter().map(|&(_, n)| n).collect();
        let mut rows = Vec::with_capacity(lens.iter().product());
        for_each_index(&lens, |_, idx| {
            let off: usize = idx
                .iter()
                .zip(lead)
                .zip(&stride)
                .map(|((&i, &(at, _)), &st)| (at + i) * st)
                .sum();
            rows.push((off + last_at) * es);
        });
        Region {
            rows,
            row: last_len * es,
        }
    }

    fn copy_in(&self, full: &mut [u8], block: &[u8]) {
        for (k, &at) in self.rows.iter().enumerate() {
            full[at..at + self.row].copy_from_slice(&block[k * self.row..(k + 1) * self.row]);
        }
    }

    fn equals(&self, full: &[u8], block: &[u8]) -> bool {
        self.rows
            .iter()
            .enumerate()
            .all(|(k, &at)| full[at..at + self.row] == block[k * self.row..(k + 1) * self.row])
    }
}

/// The padded global features back to the serial sample: pads dropped, items of
/// owner-partitioned axes back in serial order, padded-layout indices back to serial,
/// a map delivered in another form than the sample's back in the sample's.
pub fn unpad(
    plan: &Plan,
    layout: &SampleLayout,
    padded: BTreeMap<String, Dense>,
) -> Result<BTreeMap<String, Dense>, ExecError> {
    padded
        .into_iter()
        .filter_map(|(name, x)| {
            let t = match tensor_plan(plan, &name) {
                Ok(t) => t,
                Err(e) => return Some(Err(e)),
            };
            // A key halo is no part of the serial sample (see `SerialAssembler`).
            if t.derived.as_ref().and_then(DeriveRule::halo).is_some() {
                return None;
            }
            Some(unpad_feature(&name, t, layout, &x).map(|y| (name, y)))
        })
        .collect()
}

fn unpad_feature(
    name: &str,
    t: &TensorPlan,
    layout: &SampleLayout,
    x: &Dense,
) -> Result<Dense, ExecError> {
    let mut select: Vec<Vec<usize>> = Vec::with_capacity(t.axes.len());
    for (a, &n) in t.axes.iter().zip(&x.shape) {
        let items = match &a.semantic {
            None => (0..n).collect(),
            Some(s) => match layout.positions.get(s) {
                Some(pos) => pos.clone(),
                None => {
                    let len = *layout.sizes.get(s).ok_or_else(|| {
                        blocks_error(name, format!("the layout has no length for `{s}`"))
                    })?;
                    (0..len.min(n)).collect()
                }
            },
        };
        select.push(items);
    }
    let mut y = gather(x, &select);
    if let Remap::ToPaddedLayout { of, .. } | Remap::ShardLocal { of, .. } = &t.remap {
        to_serial_ids(name, of, layout, crate::placed::index_none(t), &mut y)?;
    }
    crate::deliver::to_given(name, t, layout, y)
}

/// `x` at the items `select[d]` of every axis `d`.
fn gather(x: &Dense, select: &[Vec<usize>]) -> Dense {
    let es = dtype::size(x.dtype);
    let shape: Vec<usize> = select.iter().map(Vec::len).collect();
    let stride = featshard_spec::layout::contiguous_stride(&x.shape);
    let mut bytes = Vec::with_capacity(shape.iter().product::<usize>() * es);
    for_each_index(&shape, |_, idx| {
        let off: usize = idx
            .iter()
            .zip(select)
            .zip(&stride)
            .map(|((&i, s), &st)| s[i] * st)
            .sum();
        bytes.extend_from_slice(&x.bytes[off * es..(off + 1) * es]);
    });
    Dense {
        dtype: x.dtype,
        shape,
        bytes,
    }
}
