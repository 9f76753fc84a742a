//! A compact block as a hostile rank file or a corrupted buffer holds it
//! (`exec::compact::expand_stored`, what `assemble`, both `PreshardedDataset`s and a
//! receiving rank run): any dense block shape, stored dtype, shape and bytes, for any
//! feature of the example spec, is expanded to exactly its dense block or refused with a
//! message naming the feature, never a panic.
#![no_main]

use featshard::exec::array::Array;
use featshard::exec::compact::{expand_stored, stored_form};
use featshard::spec::ir::DType;
use featshard::spec::plan::TensorPlan;
use featshard_fuzz::boltz2_plan;
use libfuzzer_sys::fuzz_target;

/// A dense block for `t` from `data`: each axis a few items, or its declared size.
fn block(t: &TensorPlan, data: &mut impl Iterator<Item = u8>) -> Vec<usize> {
    let rank = match data.next() {
        Some(b) if b % 8 == 0 => usize::from(b / 8 % 6),
        _ => t.axes.len(),
    };
    (0..rank)
        .map(
            |d| match (data.next().unwrap_or(0), t.axes.get(d).and_then(|a| a.size)) {
                (b, Some(size)) if b % 4 != 0 => size as usize,
                (b, _) => usize::from(b % 24),
            },
        )
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let mut data = data.iter().copied();
    let tensors: Vec<(&String, &TensorPlan)> = boltz2_plan()
        .features
        .keys()
        .filter_map(|n| Some((n, boltz2_plan().tensor(n)?)))
        .collect();
    let pick = usize::from(data.next().unwrap_or(0)) % tensors.len();
    let (name, t) = tensors[pick];
    let dense = block(t, &mut data);
    let entries = usize::from(data.next().unwrap_or(0) % 16);
    // Mostly the stored form the plan gives, else any dtype and shape.
    let (dtype, shape) = match (data.next().unwrap_or(0), stored_form(t, &dense, entries)) {
        (b, Some((_, dtype, shape))) if b % 4 != 0 => (dtype, shape),
        (b, _) => {
            let dtype = DType::ALL[usize::from(b) % DType::ALL.len()];
            (dtype, block(t, &mut data))
        }
    };
    let Some(len) = shape
        .iter()
        .try_fold(featshard::exec::dtype::size(dtype), |n, &d| {
            n.checked_mul(d)
        })
        .filter(|&n| n <= 1 << 20)
    else {
        return;
    };
    // The stored bytes: the rest of the input, cycled to the length (a reader checks
    // a file's byte length against its header before it makes an array).
    let rest: Vec<u8> = data.collect();
    let bytes: Vec<u8> = rest.iter().copied().cycle().take(len).collect();
    if bytes.len() != len {
        return;
    }
    let stored = Array::owned(dtype, shape, bytes);
    match expand_stored(name, t, &dense, &stored) {
        Ok(out) => {
            assert_eq!(out.shape(), dense);
            assert_eq!(out.dtype(), t.dtype);
        }
        Err(e) => assert!(e.to_string().contains(name.as_str()), "{e}"),
    }
});
