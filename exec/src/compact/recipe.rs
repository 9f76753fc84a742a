//! How a tensor executor (torch, in the Python package and the tch runtime) makes a
//! compact block's dense block, stated as data: a table of rows a stored integer picks,
//! a scatter into zeros, entries written with a spare element, or a cast. Each executor
//! is a short interpreter of a [`Recipe`]; the expansion vectors (`crate::vectors`) hold
//! both to this crate's own expansion ([`Form::expand_into`]), byte for byte.

#[cfg(test)]
use featshard_spec::ir::DType;

use super::{Form, ENTRY_BYTES, ROWS_TABLE_MAX};

/// A table of rows of 0s and 1s, which stored integers pick row by row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// Row `c` the one-hot row of class `c` (`classes` wide); row `classes`, the last,
    /// all 0 (a row of none).
    OneHotRows {
        /// The class count.
        classes: usize,
    },
    /// Row `b` the eight elements byte `b` packs (bit `i` is element `i`).
    Bits,
}

impl Table {
    /// A name that tells one table from another (an executor caches tables by it).
    pub fn key(&self) -> String {
        match self {
            Table::OneHotRows { classes } => format!("one_hot_rows_{classes}"),
            Table::Bits => "bits".to_owned(),
        }
    }

    /// The number of rows.
    pub fn rows(&self) -> usize {
        match self {
            Table::OneHotRows { classes } => classes + 1,
            Table::Bits => 256,
        }
    }

    /// The elements of each row.
    pub fn width(&self) -> usize {
        match self {
            Table::OneHotRows { classes } => *classes,
            Table::Bits => 8,
        }
    }

    /// Every element, 0 or 1, row-major (`rows x width` bytes).
    pub fn elements(&self) -> Vec<u8> {
        let width = self.width();
        (0..self.rows() * width)
            .map(|at| {
                let (r, c) = (at / width, at % width);
                match self {
                    Table::OneHotRows { .. } => u8::from(r == c),
                    Table::Bits => (r >> c & 1) as u8,
                }
            })
            .collect()
    }
}

/// The tensor operations that make a compact block's dense block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recipe {
    /// Each stored integer, clamped to `clamp` when given, picks a row of `table` (-1
    /// its last row); the picked rows, flattened and cut to the dense block's `numel`
    /// elements, viewed as `rows_shape` (the dense shape with `axis` moved last), and
    /// their last axis moved to `axis`, are the dense block.
    Rows {
        /// The table the integers pick rows of.
        table: Table,
        /// The range the integers are clamped to first.
        clamp: Option<(i64, i64)>,
        /// The dense block's elements.
        numel: usize,
        /// The dense shape with `axis` moved last.
        rows_shape: Vec<usize>,
        /// The dense axis the table's rows lie along.
        axis: usize,
    },
    /// Zeros of the dense shape, then a 1 put along `axis` at each stored index in
    /// `0..classes`; an index outside leaves its row 0 (for more classes than a table is
    /// worth, [`ROWS_TABLE_MAX`]).
    Scatter {
        /// The one-hot axis of the dense block.
        axis: usize,
        /// Its length.
        classes: usize,
    },
    /// Stored rows of `row_bytes` bytes, an `int64` flat position then the element's
    /// bits from byte `value_at` on: zeros of `numel + 1` elements, each element written
    /// at its position (a position below 0, past the last entry, at the spare element
    /// `numel`), and the first `numel` elements viewed as the dense shape. No shape
    /// depends on the data, so a device never makes its host wait.
    Entries {
        /// Bytes of one stored row.
        row_bytes: usize,
        /// Where in a row the element's bits start.
        value_at: usize,
        /// The dense block's elements.
        numel: usize,
    },
    /// The stored integers cast to the dense dtype.
    Cast,
}

impl Form {
    /// How a tensor executor makes the dense block of `dense` shape from a compact
    /// block of this form.
    pub fn recipe(&self, dense: &[usize]) -> Recipe {
        let numel = dense.iter().product();
        match *self {
            Form::OneHot { axis, classes, .. } if classes <= ROWS_TABLE_MAX => {
                let mut rows_shape = dense.to_vec();
                let moved = rows_shape.remove(axis.min(dense.len().saturating_sub(1)));
                rows_shape.push(moved);
                Recipe::Rows {
                    table: Table::OneHotRows { classes },
                    clamp: Some((-1, classes as i64)),
                    numel,
                    rows_shape,
                    axis,
                }
            }
            Form::OneHot { axis, classes, .. } => Recipe::Scatter { axis, classes },
            Form::Bits => Recipe::Rows {
                table: Table::Bits,
                clamp: None,
                numel,
                rows_shape: dense.to_vec(),
                axis: dense.len().saturating_sub(1),
            },
            Form::Sparse => Recipe::Entries {
                row_bytes: ENTRY_BYTES,
                value_at: ENTRY_BYTES / 2,
                numel,
            },
            Form::Narrow { .. } => Recipe::Cast,
        }
    }
}

/// The dense bytes a [`Recipe`] makes of `packed` (stored integers of `stored` dtype),
/// run on bytes as a tensor executor runs it: what this crate's tests hold the recipe
/// itself to, against [`Form::expand_into`].
#[cfg(test)]
pub(crate) fn run(recipe: &Recipe, stored: DType, packed: &[u8], dense: DType) -> Vec<u8> {
    use crate::dtype;
    let es = dtype::size(dense);
    let one = |out: &mut Vec<u8>| dtype::encode_i64(dense, 1, out);
    let ints = || {
        let mut out = vec![0i64; packed.len() / dtype::size(stored)];
        dtype::read_ints(stored, packed, &mut out);
        out
    };
    match recipe {
        Recipe::Rows {
            table,
            clamp,
            numel,
            rows_shape,
            axis,
        } => {
            let (elements, width) = (table.elements(), table.width());
            let mut picked: Vec<u8> = Vec::new();
            for i in ints() {
                let i = clamp.map_or(i, |(lo, hi)| i.clamp(lo, hi));
                let row = if i < 0 { table.rows() as i64 + i } else { i } as usize;
                for &e in &elements[row * width..(row + 1) * width] {
                    match e {
                        1 => one(&mut picked),
                        _ => picked.extend(std::iter::repeat_n(0, es)),
                    }
                }
            }
            picked.truncate(numel * es);
            move_last(&picked, rows_shape, *axis, es)
        }
        Recipe::Scatter { .. } | Recipe::Entries { .. } | Recipe::Cast => {
            unreachable!("run covers the table recipes")
        }
    }
}

/// Row-major `bytes` of `shape` (elements of `es` bytes) with the last axis moved to
/// `axis`.
#[cfg(test)]
fn move_last(bytes: &[u8], shape: &[usize], axis: usize, es: usize) -> Vec<u8> {
    let last = shape.len() - 1;
    let mut moved = shape[..last].to_vec();
    moved.insert(axis, shape[last]);
    let mut out = vec![0u8; bytes.len()];
    for (flat, chunk) in bytes.chunks(es).enumerate() {
        let idx = featshard_spec::layout::unravel(flat, shape);
        let mut to = idx[..last].to_vec();
        to.insert(axis, idx[last]);
        let at = to.iter().zip(&moved).fold(0, |k, (&i, &n)| k * n + i);
        out[at * es..(at + 1) * es].copy_from_slice(chunk);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors::expansion_vectors;

    #[test]
    fn table_recipes_run_on_bytes_give_the_executors_dense_blocks() {
        let mut ran = 0;
        for v in expansion_vectors() {
            let Some(e) = &v.slot.compact else { continue };
            let recipe = e.form.recipe(&e.shape);
            if !matches!(recipe, Recipe::Rows { .. }) {
                continue;
            }
            let got = run(&recipe, v.slot.dtype, &v.packed, e.dtype);
            assert_eq!(got, v.dense, "{}", v.slot.name);
            ran += 1;
        }
        assert!(ran > 20, "{ran}");
    }

    #[test]
    fn tables_hold_their_rows() {
        let t = Table::OneHotRows { classes: 3 };
        assert_eq!(t.elements(), [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]);
        let bits = Table::Bits.elements();
        assert_eq!(&bits[5 * 8..6 * 8], [1, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!(bits.len(), 256 * 8);
    }
}
