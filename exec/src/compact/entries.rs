//! Sparse features: a block as its nonzero entries. Each entry is one `int64` row of
//! two, `(position, value)`: the element's flat position in the dense block and its
//! bits (little-endian, widened to 64). Rows past the last entry hold position -1, so a
//! block of fewer entries fits a buffer made for the most any rank's block holds.
//!
//! Every element whose bits are not all zero is an entry (a float `-0.0` too), so the
//! dense block comes back byte for byte.

use std::io;

use featshard_spec::ir::DType;

use super::{bits, for_each_nonzero};
use crate::dtype;
use crate::sink::Sink;

/// Bytes of one entry: its position and its value, two `int64`.
pub const ENTRY_BYTES: usize = 16;

/// A sink that keeps the nonzero elements written into it as entries (or only counts
/// them): a sparse block made from the same windows as its dense block.
#[derive(Debug)]
pub(crate) struct Entries {
    es: usize,
    /// Elements seen so far: the position of the next one.
    at: usize,
    count: usize,
    /// The entries' rows, `None` when only counting.
    rows: Option<Vec<u8>>,
}

impl Entries {
    /// Keeps the entries of elements of `dtype`.
    pub fn new(dtype: DType) -> Self {
        Entries {
            es: dtype::size(dtype),
            at: 0,
            count: 0,
            rows: Some(Vec::new()),
        }
    }

    /// Counts the entries of elements of `dtype`, keeping none.
    pub(crate) fn counter(dtype: DType) -> Self {
        Entries {
            rows: None,
            ..Entries::new(dtype)
        }
    }

    /// Entries seen.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The entries' rows, then rows of position -1 up to `capacity` entries; an error
    /// when there are more than `capacity`.
    pub fn finish(self, capacity: usize) -> io::Result<Vec<u8>> {
        if self.count > capacity {
            return Err(io::Error::other(format!(
                "a sparse block of {} entries does not fit the {capacity} made room for",
                self.count
            )));
        }
        let mut rows = self.rows.unwrap_or_default();
        rows.reserve((capacity - self.count) * ENTRY_BYTES);
        for _ in self.count..capacity {
            rows.extend((-1i64).to_le_bytes());
            rows.extend(0i64.to_le_bytes());
        }
        Ok(rows)
    }

    fn push(&mut self, position: usize, value: u64) {
        self.count += 1;
        if let Some(rows) = &mut self.rows {
            rows.extend((position as i64).to_le_bytes());
            rows.extend(value.to_le_bytes());
        }
    }
}

impl Sink for Entries {
    fn copy(&mut self, bytes: &[u8]) -> io::Result<()> {
        let first = self.at;
        for_each_nonzero(bytes, self.es, None, |p, v| {
            self.push(first + p, v);
            Ok::<(), io::Error>(())
        })?;
        self.at += bytes.len() / self.es.max(1);
        Ok(())
    }

    fn fill(&mut self, pad: &[u8], count: usize) -> io::Result<()> {
        let v = bits(pad);
        if v != 0 {
            (self.at..self.at + count).for_each(|p| self.push(p, v));
        }
        self.at += count;
        Ok(())
    }

    fn sparse(&mut self, len: usize, _es: usize, entries: &[(usize, u64)]) -> io::Result<()> {
        for &(p, v) in entries.iter().filter(|&&(_, v)| v != 0) {
            self.push(self.at + p, v);
        }
        self.at += len;
        Ok(())
    }
}

/// The entries `rows` (as [`Entries`] makes them) written into `out`, the zeroed dense
/// block of elements of `dtype`. A position outside the block is passed over.
pub(super) fn expand_entries_into(rows: &[u8], dtype: DType, out: &mut [u8]) {
    let es = dtype::size(dtype);
    let n = out.len() / es;
    for row in rows.chunks_exact(ENTRY_BYTES) {
        let (p, v) = row_of(row);
        if let Ok(p) = usize::try_from(p) {
            if p < n {
                out[p * es..(p + 1) * es].copy_from_slice(&v.to_le_bytes()[..es]);
            }
        }
    }
}

/// One entry's position and value bits.
pub(super) fn row_of(row: &[u8]) -> (i64, u64) {
    let word = |r: &[u8]| {
        let a: [u8; 8] = r.try_into().unwrap_or([0; 8]);
        a
    };
    (
        i64::from_le_bytes(word(&row[..8])),
        u64::from_le_bytes(word(&row[8..16])),
    )
}

/// Why `rows` are not the entries of a dense block of `numel` elements of `dtype`: a
/// position outside it, positions out of order or repeated, an entry after a row of
/// -1, a value wider than the dtype (or a bool other than 0 and 1).
pub(super) fn entries_fault(rows: &[u8], numel: usize, dtype: DType) -> Option<String> {
    let es = dtype::size(dtype);
    let mut last: Option<i64> = None;
    let mut ended = false;
    for (k, row) in rows.chunks_exact(ENTRY_BYTES).enumerate() {
        let (p, v) = row_of(row);
        let fault = match p {
            -1 => {
                ended = true;
                continue;
            }
            _ if ended => "an entry after the block's last (a row of -1)".to_owned(),
            p if !usize::try_from(p).is_ok_and(|p| p < numel) => {
                format!("position {p} lies outside the block's {numel} elements")
            }
            p if last.is_some_and(|l| p <= l) => format!("position {p} repeats or is out of order"),
            _ if es < 8 && v >> (8 * es) != 0 => {
                format!("value bits {v:#x} are wider than {dtype}")
            }
            _ if dtype == DType::Bool && v > 1 => format!("value {v} is not a bool"),
            _ => {
                last = Some(p);
                continue;
            }
        };
        return Some(format!("stored entry {k}: {fault}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::Form;

    #[test]
    fn entries_give_back_the_dense_block_byte_for_byte() {
        // float32: 0, 1.5, -0.0 (an entry: its bits are not zero), 0, then 3 pads of 2.0.
        let mut dense = Vec::new();
        for v in [0.0f32, 1.5, -0.0, 0.0] {
            dense.extend(v.to_le_bytes());
        }
        let mut e = Entries::new(DType::Float32);
        e.copy(&dense).expect("copy");
        e.fill(&2.0f32.to_le_bytes(), 3).expect("fill");
        e.fill(&0.0f32.to_le_bytes(), 2).expect("fill");
        for _ in 0..3 {
            dense.extend(2.0f32.to_le_bytes());
        }
        dense.extend([0u8; 8]);
        assert_eq!(e.count(), 5);
        let rows = e.finish(7).expect("fits");
        assert_eq!(rows.len(), 7 * ENTRY_BYTES);
        assert_eq!(entries_fault(&rows, 9, DType::Float32), None);
        let mut out = vec![0u8; dense.len()];
        Form::Sparse.expand_into(&rows, DType::Float32, &[9], &mut out);
        assert_eq!(out, dense);
    }

    #[test]
    fn more_entries_than_room_or_corrupt_rows_are_refused() {
        let mut e = Entries::counter(DType::Int64);
        e.copy(&[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0])
            .expect("copy");
        assert_eq!(e.count(), 2);
        assert!(e.finish(1).is_err());
        let row = |p: i64, v: u64| [p.to_le_bytes(), v.to_le_bytes()].concat();
        let fault = |rows: Vec<Vec<u8>>, d| entries_fault(&rows.concat(), 4, d).unwrap_or_default();
        assert!(fault(vec![row(4, 1)], DType::Int64).contains("outside"));
        assert!(fault(vec![row(2, 1), row(2, 1)], DType::Int64).contains("out of order"));
        assert!(fault(vec![row(-1, 0), row(1, 1)], DType::Int64).contains("after"));
        assert!(fault(vec![row(0, 1 << 40)], DType::Float32).contains("wider"));
        assert!(fault(vec![row(0, 2)], DType::Bool).contains("not a bool"));
    }
}
