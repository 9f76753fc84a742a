//! One rank buffer's contract, for every distributor (the tch runtime's and the Python
//! package's): the slots a sample's blocks and passed-through features take, each at an
//! aligned offset, with what it holds (dtype and shape: a compact block's where it
//! travels compact), how a compact block expands (its form, the dense block's dtype
//! and shape) and its DTensor metadata. A source lays one out, writes every rank's
//! buffer by it and sends it as its header bytes; a receiver reads the header back and
//! reads its buffer by the same slots.

use featshard_spec::ir::{DType, Placement};
use featshard_spec::plan::{FeatureShapes, Plan, TensorPlan};
use featshard_spec::Coord;
use serde::{Deserialize, Serialize};

use crate::blocks::{feature_blocks, FeatureBlocks, Part};
use crate::compact::{Form, Recipe};
use crate::dtype;
use crate::error::ExecError;
use crate::placed::Placed;

/// Byte alignment of every slot: any dtype's view is legal at it, and a cache line.
pub const ALIGN: usize = 64;

/// How a compact slot's block expands to the dense block the model takes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expansion {
    /// The compact form.
    pub form: Form,
    /// The dense block's dtype.
    pub dtype: DType,
    /// The dense block's shape.
    pub shape: Vec<usize>,
}

impl Expansion {
    /// How a tensor executor makes the dense block (see [`Recipe`]).
    pub fn recipe(&self) -> Recipe {
        self.form.recipe(&self.shape)
    }
}

/// A placed feature's DTensor metadata (a passed-through feature has none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Global {
    /// The DTensor's global shape.
    pub shape: Vec<usize>,
    /// Its placements on the CP mesh axes.
    pub placements: Vec<Placement>,
}

/// Where one tensor sits in every rank's buffer, and what it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// The feature's name.
    pub name: String,
    /// The dtype the buffer holds at this slot.
    pub dtype: DType,
    /// The shape the buffer holds at this slot.
    pub shape: Vec<usize>,
    /// Byte offset in the buffer ([`ALIGN`]ed).
    pub offset: usize,
    /// DTensor metadata; `None` for a passed-through feature (replicated as it is).
    pub global: Option<Global>,
    /// How the block expands, when the slot holds a compact block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact: Option<Expansion>,
    /// How the front end that passed a value through encoded it, for a value that is
    /// not a tensor (the slot holds its bytes): `pickle` from the Python package.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
}

impl Slot {
    /// A slot of `dtype` and `shape` (offset 0 until laid out).
    pub fn new(name: &str, dtype: DType, shape: Vec<usize>, global: Option<Global>) -> Slot {
        Slot {
            name: name.to_owned(),
            dtype,
            shape,
            offset: 0,
            global,
            compact: None,
            encoding: None,
        }
    }

    /// Bytes the buffer holds at this slot.
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * dtype::size(self.dtype)
    }

    /// The dtype and shape of the block the model takes: the expansion's, or the slot's.
    pub fn dense(&self) -> (DType, &[usize]) {
        match &self.compact {
            Some(e) => (e.dtype, &e.shape),
            None => (self.dtype, &self.shape),
        }
    }

    /// Bytes of the dense block.
    pub fn dense_nbytes(&self) -> usize {
        let (d, shape) = self.dense();
        shape.iter().product::<usize>() * dtype::size(d)
    }
}

/// Every slot of a rank's buffer, laid out, and the buffer's length.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferLayout {
    /// The slots, in buffer order.
    pub slots: Vec<Slot>,
    /// Bytes of every rank's buffer.
    pub bytes: usize,
}

impl BufferLayout {
    /// `slots` laid out back to back in the order given, each at an [`ALIGN`]ed offset.
    pub fn new(mut slots: Vec<Slot>) -> BufferLayout {
        let sizes: Vec<usize> = slots.iter().map(Slot::nbytes).collect();
        let (offsets, bytes) = packed(&sizes);
        for (slot, offset) in slots.iter_mut().zip(offsets) {
            slot.offset = offset;
        }
        BufferLayout { slots, bytes }
    }

    /// Where room for the compact slots' dense blocks starts when a receiver allocates
    /// it after the buffer, in one piece: the buffer's end, [`ALIGN`]ed.
    pub fn room_at(&self) -> usize {
        self.bytes.next_multiple_of(ALIGN)
    }

    /// Bytes the dense blocks of the compact slots take, each at an [`ALIGN`]ed offset
    /// (room a receiver expands them into).
    pub fn expanded_bytes(&self) -> usize {
        room_offsets(&self.slots).1
    }

    /// `buf` (at least [`BufferLayout::bytes`] long) cut into each slot's bytes, in slot
    /// order, the alignment gaps zeroed (a recycled buffer's old bytes never show);
    /// `None` when `buf` is shorter.
    pub(crate) fn split_mut<'b>(&self, buf: &'b mut [u8]) -> Option<Vec<(&Slot, &'b mut [u8])>> {
        let mut rest = buf.get_mut(..self.bytes)?;
        let mut at = 0;
        let mut out = Vec::with_capacity(self.slots.len());
        for slot in &self.slots {
            let (gap, tail) = rest.split_at_mut(slot.offset.checked_sub(at)?);
            gap.fill(0);
            let (mine, tail) = tail.split_at_mut(slot.nbytes());
            out.push((slot, mine));
            rest = tail;
            at = slot.offset + slot.nbytes();
        }
        rest.fill(0);
        Some(out)
    }

    /// The slot of feature `name`.
    pub fn slot(&self, name: &str) -> Option<&Slot> {
        self.slots.iter().find(|s| s.name == name)
    }

    /// `Err` naming the first slot that does not lie inside the buffer at an
    /// [`ALIGN`]ed offset (a layout read from bytes a peer sent).
    pub(crate) fn check(&self) -> Result<(), String> {
        for s in &self.slots {
            let end = s
                .shape
                .iter()
                .try_fold(dtype::size(s.dtype), |n, &k| n.checked_mul(k))
                .and_then(|n| n.checked_add(s.offset));
            if end.is_none_or(|e| e > self.bytes) || s.offset % ALIGN != 0 {
                return Err(format!(
                    "a buffer layout: slot `{}` lies outside its {} bytes",
                    s.name, self.bytes
                ));
            }
        }
        Ok(())
    }
}

/// Runs of `sizes` bytes laid back to back, each at an [`ALIGN`]ed offset: their
/// offsets, and the bytes they span. Every buffer of several blocks is laid out so (a
/// rank's buffer, the room after it, the blocks a reader moves to a device in one copy).
/// Sizes from a layout (within the spec's limits) always fit; see [`checked_packed`].
pub fn packed(sizes: &[usize]) -> (Vec<usize>, usize) {
    checked_packed(sizes).unwrap_or_else(|_| (vec![usize::MAX; sizes.len()], usize::MAX))
}

/// [`packed`] of sizes from outside: `Err` with the index of the first run whose end
/// would pass `usize`.
pub fn checked_packed(sizes: &[usize]) -> Result<(Vec<usize>, usize), usize> {
    let mut end = 0usize;
    let mut offsets = Vec::with_capacity(sizes.len());
    for (k, &n) in sizes.iter().enumerate() {
        let at = end.checked_next_multiple_of(ALIGN).ok_or(k)?;
        end = at.checked_add(n).ok_or(k)?;
        offsets.push(at);
    }
    Ok((offsets, end))
}

/// Where each compact slot's dense block lies in the room after a buffer (counted from
/// [`BufferLayout::room_at`]), in slot order (`None` for a slot without a compact
/// form), and the room's bytes: each block [`ALIGN`]ed, the room a multiple of it.
pub fn room_offsets(slots: &[Slot]) -> (Vec<Option<usize>>, usize) {
    let sizes: Vec<usize> = slots
        .iter()
        .filter(|s| s.compact.is_some())
        .map(Slot::dense_nbytes)
        .collect();
    let (offsets, end) = packed(&sizes);
    let mut next = offsets.into_iter();
    let at = slots
        .iter()
        .map(|s| s.compact.as_ref().and_then(|_| next.next()));
    (at.collect(), end.next_multiple_of(ALIGN))
}

/// The slots of every feature `placed` places, in name order (see [`block_slot`]).
pub fn block_slots(plan: &Plan, placed: &Placed, compact: bool) -> Result<Vec<Slot>, ExecError> {
    let all = feature_blocks(plan, placed)?;
    all.iter()
        .filter(|f| f.is_placed())
        .map(|f| {
            let t = crate::feature::tensor_plan(plan, &f.name)?;
            Ok(block_slot(t, f, &placed.shapes[&f.name], compact))
        })
        .collect()
}

/// The slot of feature `t`'s block (its writer `f`, its shapes `s`), with its DTensor
/// metadata; with `compact`, its compact block where it has a compact form.
pub fn block_slot(t: &TensorPlan, f: &FeatureBlocks, s: &FeatureShapes, compact: bool) -> Slot {
    let global = Global {
        shape: s.global_shape.clone(),
        placements: t.placements.clone(),
    };
    let mut slot = Slot::new(&f.name, f.dtype, s.local_shape.clone(), Some(global));
    if let (true, Some(form), Some(shape)) = (compact, f.form(), f.compact_shape()) {
        slot.compact = Some(Expansion {
            form,
            dtype: f.dtype,
            shape: std::mem::replace(&mut slot.shape, shape),
        });
        slot.dtype = f.compact_dtype();
    }
    slot
}

/// The slots of the features `placed` carries along whole, in name order: each rides
/// its own slot, as it is, without DTensor metadata.
pub fn passthrough_slots(placed: &Placed) -> Vec<Slot> {
    let whole =
        |(name, x): (&String, &crate::array::Array)| Slot::new(name, x.dtype(), x.shape(), None);
    placed.passthrough.iter().map(whole).collect()
}

/// The buffer of the rank at `coord` written into `buf`, laid out as `layout` says
/// (see [`fill_ranks`]).
pub fn fill(
    plan: &Plan,
    placed: &Placed,
    layout: &BufferLayout,
    coord: Coord,
    buf: &mut [u8],
    threads: usize,
) -> Result<(), ExecError> {
    fill_ranks(plan, placed, layout, vec![(coord, buf)], threads)
}

/// The buffer of each rank (at its CP coordinate) written, laid out as `layout` says:
/// each slot's block, compact where the slot holds its compact form, a passed-through
/// feature whole, alignment gaps zeroed; on up to `threads` threads, the largest
/// blocks of every rank dealt first. The one writer of rank buffers from a placed
/// sample, for every distributor.
pub fn fill_ranks(
    plan: &Plan,
    placed: &Placed,
    layout: &BufferLayout,
    buffers: Vec<(Coord, &mut [u8])>,
    threads: usize,
) -> Result<(), ExecError> {
    let all = feature_blocks(plan, placed)?;
    let mut jobs = Vec::with_capacity(layout.slots.len() * buffers.len());
    for (coord, buf) in buffers {
        let len = buf.len();
        let slices = layout.split_mut(buf).ok_or_else(|| ExecError::Blocks {
            feature: "*".into(),
            message: format!("a buffer of {len} bytes for a layout of {}", layout.bytes),
        })?;
        for (slot, out) in slices {
            let f = all.iter().find(|f| f.name == slot.name);
            let f = f.ok_or_else(|| ExecError::Blocks {
                feature: slot.name.clone(),
                message: "the buffer layout has a slot for it; this sample has no such feature"
                    .into(),
            })?;
            let part = match slot.compact {
                Some(_) => Part::Compact(coord),
                None => Part::Block(coord),
            };
            jobs.push((f, part, out));
        }
    }
    jobs.sort_by_key(|(_, _, out)| std::cmp::Reverse(out.len()));
    crate::par::try_each(jobs, threads, |(f, part, out)| {
        f.write_part_into(placed, part, out)
            .map_err(|e| ExecError::Blocks {
                feature: f.name.clone(),
                message: e.to_string(),
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_back_to_back_and_inside_their_buffer() {
        let one = |name: &str, d, shape: Vec<usize>| Slot::new(name, d, shape, None);
        let layout = BufferLayout::new(vec![
            one("a", DType::Uint8, vec![3]),
            one("b", DType::Float64, vec![2, 5]),
            one("c", DType::Bool, vec![0]),
            one("d", DType::Int16, vec![7]),
        ]);
        let offsets: Vec<usize> = layout.slots.iter().map(|s| s.offset).collect();
        assert_eq!(offsets, vec![0, 64, 192, 192]);
        assert_eq!(layout.bytes, 192 + 14);
        assert_eq!(layout.check(), Ok(()));
        // A slot moved past the buffer's end, or off its alignment, is refused.
        for (offset, bytes) in [(256, layout.bytes), (65, 400)] {
            let mut bad = layout.clone();
            bad.slots[3].offset = offset;
            bad.bytes = bytes;
            let e = bad.check().unwrap_err();
            assert!(e.contains("slot `d` lies outside"), "{e}");
        }
    }
}
