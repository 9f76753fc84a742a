//! The expansion vectors every executor of compact blocks is held to: for every form,
//! every dense dtype it can have and the edge rows (a one-hot feature's and a map's
//! rows of none, a mask's last partial byte, sparse entries at position 0, of `-0.0`
//! and past the last, narrowed integers at their type's ends), a stored block and the
//! dense block this crate's [`Form::expand_into`] makes of it. The torch executors (the
//! Python package's, the tch runtime's on a GPU) run on the same vectors in their
//! tests, so that no executor's expansion can drift from this one's.

use featshard_spec::ir::DType;

use crate::buffer::{Expansion, Slot};
use crate::compact::{Form, ENTRY_BYTES};
use crate::dtype;

/// One stored block and the dense block it expands to.
#[derive(Clone, Debug)]
pub struct Vector {
    /// The stored block's slot: its dtype and shape, its form, its dense dtype and shape.
    pub slot: Slot,
    /// The stored block's bytes.
    pub packed: Vec<u8>,
    /// The dense block's bytes, as this crate expands them.
    pub dense: Vec<u8>,
}

/// Every vector (see the module documentation).
pub fn expansion_vectors() -> Vec<Vector> {
    let mut out = Vec::new();
    for d in DType::ALL {
        out.extend(one_hot(d));
        out.push(bits(d));
        out.push(sparse(d));
    }
    out.extend(narrow());
    out
}

/// `values` as elements of the integer dtype `d`.
fn ints(d: DType, values: &[i64]) -> Vec<u8> {
    let mut out = vec![0; values.len() * dtype::size(d)];
    dtype::write_ints(d, values, &mut out);
    out
}

/// The vector of `packed` (of `stored` dtype and shape) in `form`, dense `d` and `shape`.
fn vector(
    name: String,
    form: Form,
    (stored, stored_shape, packed): (DType, Vec<usize>, Vec<u8>),
    d: DType,
    shape: Vec<usize>,
) -> Vector {
    let mut dense = vec![0xA5; shape.iter().product::<usize>() * dtype::size(d)];
    form.expand_into(&packed, d, &shape, &mut dense);
    let mut slot = Slot::new(&name, stored, stored_shape, None);
    slot.compact = Some(Expansion {
        form,
        dtype: d,
        shape,
    });
    Vector {
        slot,
        packed,
        dense,
    }
}

/// One-hot features (5 classes in `uint8`, 300 in `int16`, each with rows of none and
/// indices past the classes, and below 0 where signed) on every axis, and a map
/// (`int32`, -1 for none) on its last.
fn one_hot(d: DType) -> Vec<Vector> {
    let mut out = Vec::new();
    for (classes, index) in [(5usize, DType::Uint8), (300, DType::Int16)] {
        let none = classes as i64;
        let below = if index == DType::Int16 { -7 } else { 1 };
        let idx = [0, none - 1, none, 2, 1, none, 3, 0, none + 5, below, -1, 4];
        let idx = idx.map(|i| {
            if i < 0 && index == DType::Uint8 {
                none
            } else {
                i
            }
        });
        for (axis, compact) in [
            (1, vec![12]),
            (0, vec![3, 4]),
            (1, vec![3, 4]),
            (2, vec![3, 4]),
        ] {
            let mut shape = compact.clone();
            shape.insert(axis, classes);
            let form = Form::OneHot {
                axis,
                classes,
                index,
                map: false,
            };
            let stored = (index, compact, ints(index, &idx));
            let name = format!("one_hot_{classes}_axis{axis}_rank{}_{d}", shape.len());
            out.push(vector(name, form, stored, d, shape));
        }
    }
    let rows = [0, -1, 3, 5, -1, 1];
    let form = Form::OneHot {
        axis: 1,
        classes: 6,
        index: DType::Int32,
        map: true,
    };
    let stored = (DType::Int32, vec![6], ints(DType::Int32, &rows));
    out.push(vector(format!("map_{d}"), form, stored, d, vec![6, 6]));
    out
}

/// A mask of 3 x 9 elements as bits: its last byte partial.
fn bits(d: DType) -> Vector {
    let packed = vec![0b1010_0101, 0xFF, 0, 0b0000_0110];
    let stored = (DType::Uint8, vec![4], packed);
    vector(format!("bits_{d}"), Form::Bits, stored, d, vec![3, 9])
}

/// Entries of a 3 x 4 block: at position 0 and the last, a `-0.0` (or the dtype's
/// own bits of it), and rows of -1 past the last.
fn sparse(d: DType) -> Vector {
    let mut minus_zero = Vec::new();
    dtype::encode_f64(d, -0.0, &mut minus_zero);
    let minus_zero = minus_zero
        .iter()
        .rev()
        .fold(0u64, |v, &b| v << 8 | u64::from(b));
    let one = if d == DType::Bool { 1 } else { 3 };
    let entries = [(0i64, one), (5, minus_zero), (11, 1), (-1, 0), (-1, 0)];
    let mut packed = Vec::with_capacity(entries.len() * ENTRY_BYTES);
    for (position, value) in entries {
        packed.extend_from_slice(&position.to_le_bytes());
        let mut v = Vec::new();
        dtype::encode_i64(d, value as i64, &mut v);
        if d.is_float() {
            v = value.to_le_bytes()[..dtype::size(d)].to_vec();
        }
        v.resize(8, 0);
        packed.extend_from_slice(&v);
    }
    let stored = (DType::Int64, vec![entries.len(), 2], packed);
    vector(format!("sparse_{d}"), Form::Sparse, stored, d, vec![3, 4])
}

/// Ranged integers narrowed, at the narrow type's ends, widened.
fn narrow() -> Vec<Vector> {
    let mut out = Vec::new();
    for (index, d) in [
        (DType::Int8, DType::Int64),
        (DType::Uint8, DType::Int32),
        (DType::Int16, DType::Int64),
        (DType::Int32, DType::Int64),
        (DType::Uint8, DType::Int16),
    ] {
        let (lo, hi) = index.int_range().unwrap_or_default();
        let values = [lo, hi, 0, 1, lo + 1, hi - 1];
        let stored = (index, vec![2, 3], ints(index, &values));
        let form = Form::Narrow { index };
        out.push(vector(
            format!("narrow_{index}_{d}"),
            form,
            stored,
            d,
            vec![2, 3],
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_and_dtype_has_vectors_whose_dense_blocks_are_written_whole() {
        let all = expansion_vectors();
        let forms: std::collections::BTreeSet<&str> = all
            .iter()
            .filter_map(|v| v.slot.compact.as_ref().map(|e| e.form.name()))
            .collect();
        assert_eq!(forms.len(), 4, "{forms:?}");
        let names: std::collections::BTreeSet<&str> =
            all.iter().map(|v| v.slot.name.as_str()).collect();
        assert_eq!(names.len(), all.len(), "every vector has a name of its own");
        for v in &all {
            assert_eq!(v.packed.len(), v.slot.nbytes(), "{}", v.slot.name);
            assert_eq!(v.dense.len(), v.slot.dense_nbytes(), "{}", v.slot.name);
            // The fill byte 0xA5 is gone: every dense byte was written.
            let es = dtype::size(v.slot.dense().0);
            let untouched = v.dense.chunks(es).any(|e| e.iter().all(|&b| b == 0xA5));
            assert!(!untouched, "{}", v.slot.name);
        }
        // Edge rows are there: some one-hot block has a row of none, some sparse one a
        // -0.0 float element.
        let f32_sparse = all
            .iter()
            .find(|v| v.slot.name == "sparse_float32")
            .unwrap();
        assert_eq!(&f32_sparse.dense[20..24], &(-0.0f32).to_le_bytes());
    }
}
