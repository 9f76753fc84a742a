//! tch tensors as the byte executor's views, and back: validation, intake and placement
//! run once, in `featshard-exec`, for both executors. A contiguous CPU tensor is viewed
//! in place (no copy); any other is copied to the CPU for the checks. What the executor
//! selects from a feature (incoming pads cut, unowned rows dropped) is then applied to
//! the original tensor on its own device; what it makes (remapped ids, derived
//! features) comes back as a new tensor; what it writes (padded layouts, blocks) goes
//! straight into tensor memory. The FFI boundary for tensor memory.

#![allow(unsafe_code)]

use std::io;

use featshard_exec::array::{Array, Sel};
use featshard_exec::files::Sample;
use featshard_exec::sink::SliceSink;
use featshard_spec::ir::DType;
use featshard_spec::plan::Plan;
use featshard_spec::Mesh;
use tch::{Device, Kind, Tensor};

use crate::error::{RuntimeError, TorchContext};
use crate::kind::{dtype_of, kind_name, kind_of};
use crate::sample::{handles, Features, Options};

/// Every feature as a view (or, off the CPU or not contiguous, a copy).
pub(crate) fn views<'t>(plan: &Plan, features: &'t Features) -> Result<Sample<'t>, RuntimeError> {
    features
        .iter()
        .map(|(name, x)| Ok((name.clone(), view(plan, name, x)?)))
        .collect()
}

/// One feature as a view (or a copy; see [`views`]).
pub(crate) fn view<'t>(plan: &Plan, name: &str, x: &'t Tensor) -> Result<Array<'t>, RuntimeError> {
    // SAFETY: the view borrows `x` for `'t`, which keeps its memory alive.
    unsafe { viewed(plan, name, x) }
}

/// [`view`] for any lifetime the caller names.
///
/// # Safety
/// A view (not a copy) reads the memory of `x`: the caller keeps a handle on `x`'s
/// storage alive for `'t`, and no handle writes or resizes it meanwhile.
unsafe fn viewed<'t>(plan: &Plan, name: &str, x: &Tensor) -> Result<Array<'t>, RuntimeError> {
    let shape: Vec<usize> = x.size().iter().map(|&d| d as usize).collect();
    let Some(dtype) = dtype_of(x.kind()) else {
        // No spec dtype: refused by name when the spec places it; carried as bytes
        // when it is passed through.
        if let Some(t) = plan.tensor(name) {
            return Err(RuntimeError::DType {
                feature: name.to_owned(),
                expected: t.dtype.name().to_owned(),
                got: kind_name(x.kind()),
            });
        }
        return Ok(Array::owned(DType::Uint8, vec![0], Vec::new()));
    };
    let numel: usize = shape.iter().product();
    let bytes = numel * featshard_exec::dtype::size(dtype);
    if x.device() == Device::Cpu && x.is_contiguous() && numel > 0 && !marked(x) {
        // SAFETY: a contiguous CPU tensor of `numel` elements of `dtype` holds `bytes`
        // bytes at `data_ptr`, alive and unwritten for `'t` (this function's contract).
        let data = unsafe { std::slice::from_raw_parts(x.data_ptr() as *const u8, bytes) };
        return Ok(Array::borrowed(dtype, shape, data, None));
    }
    let mut data = vec![0u8; bytes];
    resolved(x)
        .and_then(|c| c.f_to_device(Device::Cpu))
        .and_then(|c| c.f_contiguous())
        .and_then(|c| c.f_copy_data_u8(&mut data, numel))
        .feature(name)?;
    Ok(Array::owned(dtype, shape, data))
}

/// A sample placed on a mesh by the executor, on the memory of its tensors: the
/// executor's placed sample (`featshard_exec::Placed`, what every block writer reads)
/// and handles on the tensors it views. The tensors must not be written or resized
/// while it lives.
#[derive(Debug)]
pub struct Placed {
    // Declared first so it drops first: its arrays view the memory of `inputs`.
    placed: featshard_exec::Placed<'static>,
    inputs: Features,
}

impl Placed {
    /// Validates `features` and places them on `mesh` (see `featshard_exec::place`).
    pub(crate) fn new(
        plan: &Plan,
        mesh: Mesh,
        features: &Features,
        opts: &Options,
    ) -> Result<Placed, RuntimeError> {
        let inputs = handles(features);
        let mut seen = Sample::new();
        for (name, x) in &inputs {
            // SAFETY: `inputs` holds a handle on `x`'s storage for as long as the
            // placed sample lives (it drops first), and lends its views out only for
            // as long as it is borrowed; moving `inputs` moves handles, not memory.
            seen.insert(name.clone(), unsafe { viewed(plan, name, x)? });
        }
        let placed = featshard_exec::place(plan, mesh, &seen, opts)?;
        Ok(Placed { placed, inputs })
    }

    /// The executor's placed sample.
    pub fn exec(&self) -> &featshard_exec::Placed<'_> {
        &self.placed
    }

    /// The tensor the sample gave for key `name`.
    pub fn input(&self, name: &str) -> Option<&Tensor> {
        self.inputs.get(name)
    }

    /// Drops every placed feature's array, so that writing a block fails.
    #[cfg(test)]
    pub(crate) fn forget_arrays(&mut self) {
        self.placed.arrays.clear();
    }
}

/// Whether torch marks `x` lazily (its negative or conjugate bit): its memory then holds
/// other values than it reads as, and is never read or written as bytes.
pub(crate) fn marked(x: &Tensor) -> bool {
    x.is_neg() || x.is_conj()
}

/// `x` with its values in its memory: the marks of [`marked`] applied (a copy where
/// there are any, `x` itself otherwise).
pub(crate) fn resolved(x: &Tensor) -> Result<Tensor, tch::TchError> {
    x.f_resolve_conj()?.f_resolve_neg()
}

/// The tensor of a feature the executor returned: its selections applied to
/// `original` when it views the original's memory, else a new tensor of its bytes
/// (on the original's device, if there was one).
pub(crate) fn tensor(
    name: &str,
    a: &Array,
    original: Option<(&Tensor, &Array)>,
) -> Result<Tensor, RuntimeError> {
    match original {
        Some((x, o)) if a.same_base(o) => select(name, x, a),
        _ => {
            let shape: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
            let device = original.map_or(Device::Cpu, |(x, _)| x.device());
            Tensor::f_from_data_size(&a.to_bytes(), &shape, kind_of(a.dtype()))
                .and_then(|t| t.f_to_device(device))
                .feature(name)
        }
    }
}

/// `x` narrowed or indexed along every axis as the view `a` of it selects.
fn select(name: &str, x: &Tensor, a: &Array) -> Result<Tensor, RuntimeError> {
    let mut y = x.shallow_clone();
    for d in 0..a.dim() {
        y = match a.sel(d) {
            Sel::Range { start, len } if *start == 0 && *len == a.base_shape()[d] => continue,
            Sel::Range { start, len } => y.f_narrow(d as i64, *start as i64, *len as i64),
            Sel::List(items) => {
                let idx: Vec<i64> = items.iter().map(|&i| i as i64).collect();
                Tensor::f_from_slice(&idx)
                    .and_then(|i| i.f_to_device(x.device()))
                    .and_then(|i| y.f_index_select(d as i64, &i))
            }
        }
        .feature(name)?;
    }
    Ok(y)
}

/// Runs `fill` on all of `out`'s bytes: in place for a contiguous CPU tensor, else
/// through a buffer copied into `out` after. The one place tensor memory is written.
pub(crate) fn fill_into(
    name: &str,
    out: &Tensor,
    fill: impl FnOnce(&mut [u8]) -> Result<(), RuntimeError>,
) -> Result<(), RuntimeError> {
    let bytes = out.numel() * out.kind().elt_size_in_bytes();
    if bytes == 0 {
        return fill(&mut []);
    }
    if out.device() == Device::Cpu && out.is_contiguous() && !marked(out) {
        // SAFETY: a contiguous CPU tensor of `numel` elements holds `bytes` bytes at
        // `data_ptr`, alive while `out` is; nothing else reads or writes them while they
        // are filled (callers own the tensor they hand in).
        let data = unsafe { std::slice::from_raw_parts_mut(out.data_ptr() as *mut u8, bytes) };
        return fill(data);
    }
    let mut data = vec![0u8; bytes];
    fill(&mut data)?;
    let made = Tensor::f_from_data_size(&data, &out.size(), out.kind()).feature(name)?;
    out.shallow_clone().f_copy_(&made).feature(name)
}

/// [`fill_into`] on several tensors at once: `fill` gets all of their bytes together,
/// in order (in place where each is a contiguous CPU tensor and no two share a byte,
/// else through buffers copied in after).
pub(crate) fn fill_each(
    name: &str,
    outs: &[Tensor],
    fill: impl FnOnce(Vec<&mut [u8]>) -> Result<(), RuntimeError>,
) -> Result<(), RuntimeError> {
    let spans: Vec<(usize, usize)> = outs
        .iter()
        .map(|x| {
            (
                x.data_ptr() as usize,
                x.numel() * x.kind().elt_size_in_bytes(),
            )
        })
        .collect();
    let mut sorted: Vec<(usize, usize)> = spans.iter().copied().filter(|s| s.1 > 0).collect();
    sorted.sort_unstable();
    let apart = sorted.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0);
    let in_place = outs
        .iter()
        .all(|x| x.device() == Device::Cpu && x.is_contiguous() && !marked(x));
    if apart && in_place {
        let slices = spans
            .iter()
            .map(|&(ptr, len)| match len {
                0 => &mut [][..],
                // SAFETY: each contiguous CPU tensor of `len` bytes holds them at
                // `data_ptr`, alive while `outs` is borrowed; no two share a byte
                // (checked above), and nothing else reads or writes them while they
                // are filled (callers own the tensors they hand in).
                _ => unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) },
            })
            .collect();
        return fill(slices);
    }
    let mut data: Vec<Vec<u8>> = spans.iter().map(|&(_, len)| vec![0u8; len]).collect();
    fill(data.iter_mut().map(Vec::as_mut_slice).collect())?;
    for (out, bytes) in outs.iter().zip(&data) {
        let made = Tensor::f_from_data_size(bytes, &out.size(), out.kind()).feature(name)?;
        out.shallow_clone().f_copy_(&made).feature(name)?;
    }
    Ok(())
}

/// Runs `write` on the memory of `out`, which it must fill exactly (see [`fill_into`]).
pub(crate) fn write_into(
    name: &str,
    out: &Tensor,
    write: impl FnOnce(&mut SliceSink) -> io::Result<()>,
) -> Result<(), RuntimeError> {
    fill_into(name, out, |data| {
        let want = data.len();
        let mut sink = SliceSink::new(data);
        write(&mut sink)
            .and_then(|()| match sink.written() == want {
                true => Ok(()),
                false => Err(io::Error::other(format!(
                    "{} bytes written into a block of {want}",
                    sink.written()
                ))),
            })
            .map_err(|e| RuntimeError::Blocks {
                feature: name.to_owned(),
                message: e.to_string(),
            })
    })
}

/// A new contiguous CPU tensor of `shape` and `kind`.
fn new_cpu(name: &str, shape: &[usize], kind: Kind) -> Result<Tensor, RuntimeError> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    Tensor::f_empty(dims.as_slice(), (kind, Device::Cpu)).feature(name)
}

/// A new tensor of `shape` and `kind` on `device`, filled by `write` (see [`write_into`]).
pub(crate) fn new_written(
    name: &str,
    shape: &[usize],
    kind: Kind,
    device: Device,
    write: impl FnOnce(&mut SliceSink) -> io::Result<()>,
) -> Result<Tensor, RuntimeError> {
    let cpu = new_cpu(name, shape, kind)?;
    write_into(name, &cpu, write)?;
    match device {
        Device::Cpu => Ok(cpu),
        d => cpu.f_to_device(d).feature(name),
    }
}

/// A new contiguous CPU tensor of `shape` and `kind` whose bytes `fill` writes, all of
/// them (see [`fill_into`]).
pub(crate) fn new_filled(
    name: &str,
    shape: &[usize],
    kind: Kind,
    fill: impl FnOnce(&mut [u8]),
) -> Result<Tensor, RuntimeError> {
    let out = new_cpu(name, shape, kind)?;
    fill_into(name, &out, |data| {
        fill(data);
        Ok(())
    })?;
    Ok(out)
}
