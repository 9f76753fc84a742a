//! The nonzero entries of a mostly-zero base (a one-hot map), found in one pass over its
//! bytes and kept: every later check of the feature (owners, one-hot rows, incoming
//! cuts, diagonal blocks) reads them instead of the base.

use super::{nonzeros, RELEASE_BYTES};
use featshard_spec::ir::DType;

use crate::dtype::size;

/// The nonzero entries of every row (of the last axis) of a base, row by row.
#[derive(Debug)]
pub(crate) struct Sparse {
    /// Where each row's entries start in `cols` and `vals`; one more than the rows.
    starts: Vec<usize>,
    cols: Vec<usize>,
    vals: Vec<f64>,
}

/// More nonzero entries than one in this many and the base is read as it is instead.
const DENSITY: usize = 16;

impl Sparse {
    /// The entries of `bytes` (a row-major base of `shape`), or `None` when it is not
    /// mostly zero. `release` gives back the bytes read, a range at a time.
    pub(crate) fn build(
        dtype: DType,
        shape: &[usize],
        bytes: &[u8],
        release: impl Fn(usize, usize),
    ) -> Option<Sparse> {
        let inner = *shape.last()?;
        let row = inner * size(dtype);
        let rows = bytes.len().checked_div(row).unwrap_or(0);
        let limit = rows * inner / DENSITY + DENSITY;
        let mut s = Sparse {
            starts: Vec::with_capacity(rows + 1),
            cols: Vec::new(),
            vals: Vec::new(),
        };
        let (mut entries, mut from) = (Vec::new(), 0);
        s.starts.push(0);
        for r in 0..rows {
            entries.clear();
            nonzeros(dtype, &bytes[r * row..(r + 1) * row], &mut entries);
            s.cols.extend(entries.iter().map(|e| e.0));
            s.vals.extend(entries.iter().map(|e| e.1));
            s.starts.push(s.cols.len());
            if s.cols.len() > limit {
                release(from, bytes.len());
                return None;
            }
            if (r + 1) * row - from >= RELEASE_BYTES {
                release(from, (r + 1) * row);
                from = (r + 1) * row;
            }
        }
        release(from, bytes.len());
        Some(s)
    }

    /// The entries of a one-hot map known by the column of each row's 1.
    pub(crate) fn from_rows(rows: &[Option<usize>]) -> Sparse {
        let mut s = Sparse {
            starts: Vec::with_capacity(rows.len() + 1),
            cols: Vec::with_capacity(rows.len()),
            vals: Vec::with_capacity(rows.len()),
        };
        s.starts.push(0);
        for c in rows.iter().flatten() {
            s.cols.push(*c);
            s.vals.push(1.0);
        }
        let mut at = 0;
        for r in rows {
            at += usize::from(r.is_some());
            s.starts.push(at);
        }
        s
    }

    /// The entries (base column, value) of base row `r`.
    pub(crate) fn row(&self, r: usize) -> impl Iterator<Item = (usize, f64)> + '_ {
        let (a, b) = (self.starts[r], self.starts[r + 1]);
        self.cols[a..b]
            .iter()
            .copied()
            .zip(self.vals[a..b].iter().copied())
    }
}
