//! A rank's byte buffer read back into blocks, by the slots of the header the source
//! broadcast (`featshard_exec::header`).

use std::collections::BTreeMap;

use tch::{Device, Kind, Tensor};

use super::on_device;
use crate::kind::kind_of;
use crate::shard::{DTensorMeta, LocalBlock};
use featshard_exec::buffer::{room_offsets, Expansion, Global, Slot};

/// The typed view of one slot inside a byte buffer.
pub fn view(buf: &Tensor, slot: &Slot) -> Result<Tensor, tch::TchError> {
    let shape: Vec<i64> = slot.shape.iter().map(|&n| n as i64).collect();
    let kind = kind_of(slot.dtype);
    let bytes = buf.f_narrow(0, slot.offset as i64, slot.nbytes() as i64)?;
    let typed = if kind == Kind::Uint8 {
        bytes
    } else {
        bytes.f_view_dtype(kind)?
    };
    typed.f_view(shape.as_slice())
}

/// Blocks by name, and passed-through features by name.
pub type Unpacked = (BTreeMap<String, LocalBlock>, BTreeMap<String, Tensor>);

/// The feature whose slot failed, and why.
pub type SlotError = (String, tch::TchError);

/// Splits a received buffer into blocks (with DTensor metadata) and passed-through
/// features; every tensor is a view of `buf` but a compact block's, expanded into a
/// new one by the executor (`featshard_exec::compact`).
pub fn unpack(buf: &Tensor, slots: &[Slot]) -> Result<Unpacked, SlotError> {
    unpack_into(buf, None, slots)
}

/// [`unpack`], compact blocks expanded into `room` ([`expanded_bytes`] of memory, a
/// pooled buffer's tail) when given: every tensor is then a view of `buf` or `room`.
pub fn unpack_into(
    buf: &Tensor,
    room: Option<&Tensor>,
    slots: &[Slot],
) -> Result<Unpacked, SlotError> {
    let mut blocks = BTreeMap::new();
    let mut passthrough = BTreeMap::new();
    let (at, _) = room_offsets(slots);
    for (slot, at) in slots.iter().zip(at) {
        let t = view(buf, slot).map_err(|e| (slot.name.clone(), e))?;
        let t = match (&slot.compact, room, at) {
            (Some(c), Some(room), Some(at)) => {
                let dense = dense_view(room, at, c).map_err(|e| (slot.name.clone(), e))?;
                expand_into(&slot.name, &t, c, &dense).map_err(|e| (slot.name.clone(), e))?;
                dense
            }
            (Some(c), _, _) => expand(&slot.name, &t, c).map_err(|e| (slot.name.clone(), e))?,
            (None, _, _) => t,
        };
        match &slot.global {
            Some(Global {
                shape: global_shape,
                placements,
            }) => {
                blocks.insert(
                    slot.name.clone(),
                    LocalBlock {
                        tensor: t,
                        meta: DTensorMeta {
                            stride: crate::shard::contiguous_stride(global_shape),
                            global_shape: global_shape.clone(),
                            placements: placements.clone(),
                        },
                    },
                );
            }
            None => {
                passthrough.insert(slot.name.clone(), t);
            }
        }
    }
    Ok((blocks, passthrough))
}

/// A compact block's bytes.
fn bytes_of(packed: &Tensor) -> Result<Vec<u8>, tch::TchError> {
    let mut bytes = vec![0u8; packed.numel() * packed.kind().elt_size_in_bytes()];
    packed
        .f_contiguous()?
        .f_copy_data_u8(&mut bytes, packed.numel())?;
    Ok(bytes)
}

fn torch_error(e: crate::error::RuntimeError) -> tch::TchError {
    tch::TchError::Torch(e.to_string())
}

/// A compact block's dense block, in a new tensor on its device.
fn expand(
    name: &str,
    packed: &Tensor,
    e @ Expansion { form, dtype, shape }: &Expansion,
) -> Result<Tensor, tch::TchError> {
    if packed.device() != Device::Cpu {
        return on_device::expanded(packed, &e.recipe(), *dtype, shape);
    }
    let bytes = bytes_of(packed)?;
    crate::views::new_filled(name, shape, kind_of(*dtype), |out| {
        form.expand_into(&bytes, *dtype, shape, out);
    })
    .map_err(torch_error)
}

/// A dense block's view of `room`, at byte `at` ([`room_offsets`]).
fn dense_view(
    room: &Tensor,
    at: usize,
    Expansion { dtype, shape, .. }: &Expansion,
) -> Result<Tensor, tch::TchError> {
    let kind = kind_of(*dtype);
    let n = shape.iter().product::<usize>() * kind.elt_size_in_bytes();
    let bytes = room.f_narrow(0, at as i64, n as i64)?;
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let typed = if kind == Kind::Uint8 {
        bytes
    } else {
        bytes.f_view_dtype(kind)?
    };
    typed.f_view(dims.as_slice())
}

/// A compact block expanded into `out`, a view of its dense block's memory: by the
/// executor on the host, by torch on a GPU (only the compact block is ever there).
fn expand_into(
    name: &str,
    packed: &Tensor,
    e @ Expansion { form, dtype, shape }: &Expansion,
    out: &Tensor,
) -> Result<(), tch::TchError> {
    if packed.device() != Device::Cpu {
        return on_device::expand_into(packed, &e.recipe(), *dtype, out);
    }
    let bytes = bytes_of(packed)?;
    crate::views::fill_into(name, out, |dense| {
        form.expand_into(&bytes, *dtype, shape, dense);
        Ok(())
    })
    .map_err(torch_error)
}
