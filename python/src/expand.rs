//! Compact blocks made dense on the host by the executor: each checked
//! (`check_stored`) and expanded (`Form::expand_into`) into one new buffer, huge pages
//! advised, so that a rank's dense blocks cost one allocation and few page faults. The
//! distribute path and the pre-sharded reader both come here on the host; on a CUDA
//! mesh the reader only checks here (`check_blocks`), and torch expands on the GPU.

use featshard_exec::array::Array;
use featshard_exec::compact::{check_stored, Form};
use featshard_exec::dtype;
use featshard_spec::plan::TensorPlan;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::dlpack::{Buffer, Memory};

/// One compact block to expand: its feature, its dense block's shape, and the compact
/// block (a DLPack capsule of a host tensor).
pub(crate) struct Compact<'p, 'py> {
    pub name: String,
    pub plan: &'p TensorPlan,
    pub dense: Vec<usize>,
    pub stored: Bound<'py, PyCapsule>,
}

/// The dense blocks of `blocks` in one new buffer: the buffer as a uint8 capsule, and
/// each block's byte offset in it (aligned as a rank buffer's slots are), in the order
/// given. A block that is not its feature's compact form is refused by name, and
/// nothing is expanded.
pub(crate) fn expand_blocks<'py>(
    py: Python<'py>,
    blocks: &[Compact<'_, 'py>],
) -> Result<(Bound<'py, PyAny>, Vec<usize>), String> {
    let (checked, end) = check_blocks(blocks)?;
    let mut buffer = Buffer::new(end).map_err(|e| {
        let names: Vec<&str> = blocks.iter().map(|b| b.name.as_str()).collect();
        format!(
            "the dense blocks of feature(s) `{}`: cannot allocate {end} bytes ({:.2} GB): {e}",
            names.join("`, `"),
            end as f64 / 1e9
        )
    })?;
    let out = buffer.bytes_mut();
    let mut written = 0;
    for (b, (memory, form, offset)) in blocks.iter().zip(&checked) {
        let bytes = b.dense.iter().product::<usize>() * dtype::size(b.plan.dtype);
        // Recycled memory: the alignment gaps are zeroed, each block is written whole.
        out[written..*offset].fill(0);
        written = offset + bytes;
        form.expand_into(
            memory.bytes(),
            b.plan.dtype,
            &b.dense,
            &mut out[*offset..offset + bytes],
        );
    }
    let offsets = checked.iter().map(|c| c.2).collect();
    let capsule = buffer.into_capsule(py).map_err(|e| e.to_string())?;
    Ok((capsule, offsets))
}

/// A checked compact block: its memory, its form, and its dense block's byte offset.
pub(crate) type Checked = (Memory, Form, usize);

/// Every block of `blocks` checked (`check_stored`): its memory, its form and its dense
/// block's offset in one buffer of them all, and that buffer's length; the first
/// block that is not its feature's compact form is refused by name.
pub(crate) fn check_blocks<'py>(
    blocks: &[Compact<'_, 'py>],
) -> Result<(Vec<Checked>, usize), String> {
    let mut checked = Vec::with_capacity(blocks.len());
    let mut sizes = Vec::with_capacity(blocks.len());
    for b in blocks {
        let memory = Memory::new(&b.name, &b.stored).map_err(|e| e.to_string())?;
        let array = Array::borrowed(memory.dtype, memory.shape.clone(), memory.bytes(), None);
        let form = check_stored(&b.name, b.plan, &b.dense, &array).map_err(|e| e.to_string())?;
        // `check_stored` has shown each block's bytes addressable; their sum may not be.
        sizes.push(b.dense.iter().product::<usize>() * dtype::size(b.plan.dtype));
        checked.push((memory, form));
    }
    let (offsets, end) = featshard_exec::buffer::checked_packed(&sizes).map_err(|k| {
        format!(
            "feature `{}`: the dense blocks are larger than memory can address",
            blocks[k].name
        )
    })?;
    let checked = checked
        .into_iter()
        .zip(offsets)
        .map(|((memory, form), at)| (memory, form, at))
        .collect();
    Ok((checked, end))
}
