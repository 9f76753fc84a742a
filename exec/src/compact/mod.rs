//! Compact one-hot features. A feature declared `one_hot: AXIS` is held as the index
//! of each row's 1 along that axis, in the smallest integer type that holds the class
//! count, the class count itself standing for a row with no 1 (a pad row). The indices
//! are made once from the serial sample, by the pass that validates it; a rank's
//! compact block is then written through the same windows as any block (the one-hot
//! axis is a channel axis, never split), and expanded back to exactly the dense bytes
//! wherever a dense block is needed.
//!
//! A one-hot map (`index: {one_hot: AXIS}` on its last axis, `atom_to_token`) is held
//! the same way: each row's 1 as its position in the padded layout of the indexed
//! semantic (int32, -1 for none), and a rank's compact block as the position within
//! its block's window of that axis (the map's one lies in its diagonal block), so its
//! classes are the block's length of that axis.
//!
//! A mask (validated 0 or 1) travels as bits: a rank's block written through the same
//! window, eight elements to a byte ([`Bits`]), expanded back by [`unpack_bits`].
//!
//! A sparse feature (`sparse: true`) travels as its nonzero entries (`entries`), a
//! ranged integer feature (`range: [lo, hi]`) in the narrowest type holding its range
//! (`narrow`).
//!
//! `given` reads one-hot features and maps a sample gives as their indices; `stored`
//! says, for every writer and reader of rank files and buffers, what a feature's compact
//! block is and checks one read back.

mod bits;
mod entries;
mod given;
mod given_entries;
mod narrow;
mod recipe;
mod stored;

pub(crate) use bits::bits_len;
use bits::unpack_bits_into;
pub(crate) use bits::Bits;
pub(crate) use entries::Entries;
pub use entries::ENTRY_BYTES;
pub(crate) use given::given_as_indices;
pub(crate) use given::{given_narrow, indices_given, map_given_as_indices, narrow_hint};
pub(crate) use given_entries::entries_from_pairs;
pub use given_entries::{INDICES, SHAPE, VALUES};
pub(crate) use narrow::narrowed;
pub(crate) use narrow::{check_range, Cast};
pub use recipe::{Recipe, Table};
pub use stored::{check_stored, expand_stored, stored_form};
pub(crate) use stored::{stored_entries, stored_entries_of};

use featshard_spec::ir::{DType, Role};
use featshard_spec::layout::unravel;
use featshard_spec::plan::TensorPlan;
use serde::{Deserialize, Serialize};

use crate::array::Array;
use crate::dtype;
use crate::error::ExecError;

/// The most classes a torch executor expands a one-hot block of from a table of its
/// rows (`(classes + 1) x classes` elements, 0.5 MB of int64 at 256); beyond, it
/// scatters into zeros. Both torch executors (the Python package's and the tch
/// runtime's) follow it.
pub(crate) const ROWS_TABLE_MAX: usize = 256;

/// How a compact block expands to its dense block (what a receiver is told).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Form {
    /// A one-hot feature or map as indices along `axis` (of `classes`), of dtype `index`.
    OneHot {
        /// The one-hot axis of the dense block.
        axis: usize,
        /// Its length in the dense block.
        classes: usize,
        /// The indices' dtype.
        index: DType,
        /// Whether it is a map (none is -1) or a one-hot feature (none is `classes`).
        map: bool,
    },
    /// A mask as bits, eight elements to a byte.
    Bits,
    /// A sparse feature as its nonzero entries: `int64` rows of (position, value bits),
    /// -1 past the last (see `entries`).
    Sparse,
    /// A ranged integer feature in the narrower integer type `index`.
    Narrow {
        /// The stored integers' dtype.
        index: DType,
    },
}

impl Form {
    /// The form's name, as its wire header spells it: `one_hot`, `bits`, `sparse`,
    /// `narrow`.
    pub fn name(&self) -> &'static str {
        match self {
            Form::OneHot { .. } => "one_hot",
            Form::Bits => "bits",
            Form::Sparse => "sparse",
            Form::Narrow { .. } => "narrow",
        }
    }

    /// The dense bytes of `packed` (a compact block of this form) into `out`, which
    /// holds exactly the dense block of `dense` shape and `dtype`: every byte is
    /// written (a one-hot block row by row, a sparse one zeroed first, bits and narrow
    /// ints element by element).
    pub fn expand_into(&self, packed: &[u8], dtype: DType, dense: &[usize], out: &mut [u8]) {
        if matches!(self, Form::Sparse) {
            out.fill(0);
        }
        match *self {
            Form::OneHot {
                axis,
                classes,
                index,
                map,
            } => {
                let oh = OneHot {
                    axis,
                    classes,
                    index,
                    dense: dtype,
                    map,
                };
                expand_into(&oh, packed, &oh.compact_shape(dense), out);
            }
            Form::Bits => unpack_bits_into(packed, dense.iter().product(), dtype, out),
            Form::Sparse => entries::expand_entries_into(packed, dtype, out),
            Form::Narrow { index } => dtype::cast(index, packed, dtype, out),
        }
    }
}

/// How one one-hot feature is held compact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OneHot {
    /// The one-hot axis of the dense feature.
    pub axis: usize,
    /// Its size: the class count.
    pub classes: usize,
    /// The indices' dtype.
    pub index: DType,
    /// The dense feature's dtype.
    pub dense: DType,
    /// A one-hot map: `classes` is its block's length of the one-hot axis, indices are
    /// positions, and none is -1.
    pub map: bool,
}

impl OneHot {
    /// The compact form of a feature declared one-hot, or of a one-hot map on its last
    /// axis whose blocks are `local` long.
    pub fn of(t: &TensorPlan, local: &[usize]) -> Option<OneHot> {
        if let Some(axis) = t.one_hot {
            let classes = usize::try_from(t.axes.get(axis)?.size?).ok()?;
            return Some(OneHot {
                axis,
                classes,
                index: index_dtype(classes),
                dense: t.dtype,
                map: false,
            });
        }
        let Role::Index(ix) = &t.role else {
            return None;
        };
        let axis = ix.one_hot.filter(|&a| a + 1 == t.axes.len())?;
        Some(OneHot {
            axis,
            classes: *local.get(axis)?,
            index: DType::Int32,
            dense: t.dtype,
            map: true,
        })
    }

    /// The wire form of this compact form.
    pub fn form(&self) -> Form {
        Form::OneHot {
            axis: self.axis,
            classes: self.classes,
            index: self.index,
            map: self.map,
        }
    }

    /// The index of a row with no 1 (a pad row).
    pub fn none(&self) -> i64 {
        if self.map {
            -1
        } else {
            self.classes as i64
        }
    }

    /// One index element holding [`OneHot::none`].
    pub(crate) fn none_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        dtype::encode_i64(self.index, self.none(), &mut out);
        out
    }

    /// The compact shape of a dense shape: the one-hot axis removed.
    pub fn compact_shape(&self, dense: &[usize]) -> Vec<usize> {
        let mut s = dense.to_vec();
        if self.axis < s.len() {
            s.remove(self.axis);
        }
        s
    }

    /// The dense shape of a compact shape: the class axis put back.
    pub fn dense_shape(&self, compact: &[usize]) -> Vec<usize> {
        let mut s = compact.to_vec();
        s.insert(self.axis.min(s.len()), self.classes);
        s
    }

    /// `(outer, inner)` element counts around the one-hot axis of `dense`.
    fn around(&self, dense: &[usize]) -> (usize, usize) {
        let outer = dense[..self.axis].iter().product();
        let inner = dense[self.axis + 1..].iter().product();
        (outer, inner)
    }
}

/// The smallest integer dtype holding `0..=classes`.
pub(crate) fn index_dtype(classes: usize) -> DType {
    if classes <= u8::MAX as usize {
        DType::Uint8
    } else if classes <= i16::MAX as usize {
        DType::Int16
    } else if classes <= i32::MAX as usize {
        DType::Int32
    } else {
        DType::Int64
    }
}

/// An element's bits, little-endian, widened.
pub(crate) fn bits(e: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[..e.len()].copy_from_slice(e);
    u64::from_le_bytes(a)
}

/// The bits of 1 and of the float zero with its sign set (`None` for integers), in `d`.
pub(crate) fn one_and_negative_zero(d: DType) -> (u64, Option<u64>) {
    let mut one = Vec::new();
    dtype::encode_i64(d, 1, &mut one);
    let sign = match d {
        DType::Float16 | DType::Bfloat16 => Some(0x8000),
        DType::Float32 => Some(0x8000_0000),
        DType::Float64 => Some(0x8000_0000_0000_0000),
        _ => None,
    };
    (bits(&one), sign)
}

/// The indices of one-hot feature `name` (`x` at its serial shape), validating it: every
/// value is 0 or 1, and every row along the one-hot axis holds at most one 1. A fault
/// names the feature, the axis and the first bad position.
pub(crate) fn indices(name: &str, x: &Array, oh: &OneHot) -> Result<Array<'static>, ExecError> {
    let dense = x.contiguous();
    let shape = dense.shape();
    let bytes = dense.base_bytes();
    let es = dtype::size(oh.dense);
    let (outer, inner) = oh.around(&shape);
    let (one, negative_zero) = one_and_negative_zero(oh.dense);
    let fault = |flat: usize, f: RowFault| f.at(name, oh.axis, &unravel(flat, &shape));
    let none = oh.classes;
    let mut found = vec![none; outer * inner];
    let per_outer = oh.classes * inner;
    let mut visit = |flat: usize, v: u64| -> Result<(), ExecError> {
        if v != one {
            let mut value = Vec::new();
            dtype::decode_into(oh.dense, &bytes[flat * es..(flat + 1) * es], &mut value);
            let found = value.first().copied().unwrap_or(f64::NAN);
            return Err(fault(flat, RowFault::Value(found)));
        }
        let (o, k, i) = (flat / per_outer, flat % per_outer / inner, flat % inner);
        let row = &mut found[o * inner + i];
        if *row != none {
            return Err(fault(flat, RowFault::Second(*row, k)));
        }
        *row = k;
        Ok(())
    };
    // Pages of a mapped sample are given back as the scan passes them.
    for (c, chunk) in bytes.chunks(SCAN_CHUNK).enumerate() {
        let first = c * SCAN_CHUNK / es;
        for_each_nonzero(chunk, es, negative_zero, |p, v| visit(first + p, v))?;
        dense.release_bytes(c * SCAN_CHUNK, c * SCAN_CHUNK + chunk.len());
    }
    let found: Vec<i64> = found.into_iter().map(|k| k as i64).collect();
    let mut out = vec![0u8; found.len() * dtype::size(oh.index)];
    dtype::write_ints(oh.index, &found, &mut out);
    Ok(Array::owned(oh.index, oh.compact_shape(&shape), out))
}

/// A row that breaks the one-hot rule, for one-hot features and maps alike.
#[derive(Clone, Copy, Debug)]
enum RowFault {
    /// An element neither 0 nor 1.
    Value(f64),
    /// A second 1 in a row: the classes of the first and the second.
    Second(usize, usize),
}

impl RowFault {
    /// The error naming feature `name`, its one-hot `axis` and the position `at`.
    fn at(self, name: &str, axis: usize, at: &[usize]) -> ExecError {
        let message = match self {
            RowFault::Value(v) => format!("a one-hot row holds only 0 and 1, found {v}"),
            RowFault::Second(first, second) => format!(
                "a one-hot row holds one 1 (or none, a pad row), found a second 1 (classes {first} and {second})"
            ),
        };
        ExecError::OneHot {
            feature: name.to_owned(),
            axis,
            message: format!("{message} at {at:?}"),
        }
    }
}

/// Checks one-hot map `name` (`x` at its serial shape, one-hot along `axis`): the
/// one-hot rule of [`indices`], with its wording, read through the rows' nonzero
/// entries (a map's rows are read once, and that index serves its compact form too).
pub(crate) fn check_map_rows(name: &str, x: &Array, axis: usize) -> Result<(), ExecError> {
    let shape = x.shape();
    let last = shape.len() - 1;
    // Along a last axis a row is one call; along another, each one's class is kept,
    // keyed by the position without `axis`.
    let mut first: Vec<Option<usize>> = match axis == last {
        true => Vec::new(),
        false => vec![None; x.numel() / shape[axis].max(1)],
    };
    x.for_each_row_nonzero(|idx, nz| {
        let at = |j: usize| [idx, &[j]].concat();
        if let Some(&(j, v)) = nz.iter().find(|&&(_, v)| v != 1.0) {
            return Err(RowFault::Value(v).at(name, axis, &at(j)));
        }
        if axis == last {
            return match nz {
                [(a, _), (b, _), ..] => Err(RowFault::Second(*a, *b).at(name, axis, &at(*b))),
                _ => Ok(()),
            };
        }
        let key = (0..last)
            .filter(|&d| d != axis)
            .fold(0, |k, d| k * shape[d] + idx[d]);
        for &(j, _) in nz {
            match first[key * shape[last] + j].replace(idx[axis]) {
                Some(a) => return Err(RowFault::Second(a, idx[axis]).at(name, axis, &at(j))),
                None => continue,
            }
        }
        Ok(())
    })
}

/// Bytes of a sample scanned before its pages are given back (a multiple of every
/// element size and of a scan block).
pub(crate) const SCAN_CHUNK: usize = 8 << 20;

/// Calls `f` with the index and bits of every element of `bytes` (elements of `es`
/// bytes: 1, 2, 4 or 8) that is neither 0 nor `negative_zero`. Blocks of 64 zero bytes
/// (most of a one-hot feature) are passed over with one test of eight words, and zero
/// words of a block that is not, so that only the words holding a value are decoded.
fn for_each_nonzero<E>(
    bytes: &[u8],
    es: usize,
    negative_zero: Option<u64>,
    mut f: impl FnMut(usize, u64) -> Result<(), E>,
) -> Result<(), E> {
    const BLOCK: usize = 64;
    let mut visit = |at: usize, e: &[u8]| {
        let v = bits(e);
        match v != 0 && Some(v) != negative_zero {
            true => f(at / es, v),
            false => Ok(()),
        }
    };
    let blocks = bytes.chunks_exact(BLOCK);
    let tail = blocks.remainder();
    for (b, block) in blocks.enumerate() {
        let words: [u64; 8] = std::array::from_fn(|w| word(&block[w * 8..w * 8 + 8]));
        if words.iter().fold(0, |a, &w| a | w) == 0 {
            continue;
        }
        for w in (0..8).filter(|&w| words[w] != 0) {
            let at = b * BLOCK + w * 8;
            for (j, e) in block[w * 8..w * 8 + 8].chunks_exact(es).enumerate() {
                visit(at + j * es, e)?;
            }
        }
    }
    let start = bytes.len() - tail.len();
    for (j, e) in tail.chunks_exact(es).enumerate() {
        visit(start + j * es, e)?;
    }
    Ok(())
}

/// Eight bytes as a little-endian word.
fn word(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
}

/// A one-hot map's indices (`x` at its serial shape, already checked): each row's 1 as
/// the padded position of its column (`positions`, or the column itself on an
/// end-padded semantic), -1 for a row with none.
pub(crate) fn map_indices(x: &Array, positions: Option<&[usize]>) -> Array<'static> {
    let shape = x.shape();
    let mut out = Vec::with_capacity(x.numel() / shape.last().copied().unwrap_or(1).max(1) * 4);
    let _ = x.for_each_row_nonzero(|_, nz| {
        let at = nz
            .first()
            .map_or(-1, |&(c, _)| positions.map_or(c, |p| p[c]) as i64);
        dtype::encode_i64(DType::Int32, at, &mut out);
        Ok::<(), std::convert::Infallible>(())
    });
    Array::owned(
        DType::Int32,
        shape[..shape.len().saturating_sub(1)].to_vec(),
        out,
    )
}

/// The dense bytes of compact indices `idx` (row-major, of `compact` shape): a 1 at
/// each row's class, 0 elsewhere; a row of index `none` (or any index past the classes)
/// all 0.
pub(crate) fn expand(oh: &OneHot, idx: &[u8], compact: &[usize]) -> Vec<u8> {
    let n: usize = oh.dense_shape(compact).iter().product();
    let mut out = vec![0u8; n * dtype::size(oh.dense)];
    expand_into(oh, idx, compact, &mut out);
    out
}

/// [`expand`] into `out` (exactly the dense block's bytes, every one of them written).
fn expand_into(oh: &OneHot, idx: &[u8], compact: &[usize], out: &mut [u8]) {
    let (outer, inner) = oh.around(&oh.dense_shape(compact));
    let es = dtype::size(oh.dense);
    if inner == 1 {
        let given = match es {
            1 => rows_whole::<1>(oh, idx, outer, out),
            2 => rows_whole::<2>(oh, idx, outer, out),
            4 => rows_whole::<4>(oh, idx, outer, out),
            _ => rows_whole::<8>(oh, idx, outer, out),
        };
        // Rows past the indices given (none when the block is well formed) are zeros.
        let end = out.len();
        out[(given * oh.classes * es).min(end)..].fill(0);
        return;
    }
    let mut one = Vec::new();
    dtype::encode_i64(oh.dense, 1, &mut one);
    let class = |k: i64| usize::try_from(k).ok().filter(|&k| k < oh.classes);
    out.fill(0);
    let mut at = 0;
    each_index(
        oh.index,
        idx,
        std::iter::repeat_n((), outer * inner),
        |k, ()| {
            let (o, i) = (at / inner, at % inner);
            at += 1;
            if let Some(k) = class(k) {
                let e = ((o * oh.classes + k) * inner + i) * es;
                out[e..e + es].copy_from_slice(&one);
            }
        },
    );
}

/// The first `outer` rows of one-hot `out` (the class axis innermost, elements of `N`
/// bytes) written from the indices `idx`: a group of rows of about [`GROUP`] bytes
/// zeroed by one fill (the C library's widest stores; a loop of ours writes half as
/// fast), then each row given its one while the group is in cache. Returns the rows
/// written.
fn rows_whole<const N: usize>(oh: &OneHot, idx: &[u8], outer: usize, out: &mut [u8]) -> usize {
    let one = dtype::one_as::<N>(oh.dense);
    let row = (oh.classes * N).max(1);
    let rows = outer.min(out.len() / row);
    let per_group = (GROUP / row).max(1);
    let Ok(()) = dtype::by_piece(oh.index, idx, |first, wide| {
        let wide = &wide[..wide.len().min(rows.saturating_sub(first))];
        for (g, ks) in wide.chunks(per_group).enumerate() {
            let start = (first + g * per_group) * row;
            let group = &mut out[start..start + ks.len() * row];
            group.fill(0);
            for (r, &k) in group.chunks_exact_mut(row).zip(ks) {
                // An index naming no class (past them, or negative) sets no element.
                if let Some(k) = usize::try_from(k).ok().filter(|&k| k < oh.classes) {
                    r[k * N..k * N + N].copy_from_slice(&one);
                }
            }
        }
        Ok::<(), std::convert::Infallible>(())
    });
    rows.min(idx.len() / dtype::size(oh.index))
}

/// The bytes of one-hot rows zeroed at once before their ones are set: small enough
/// to stay in the first-level cache for the second pass.
const GROUP: usize = 16 << 10;

/// `f` called with each index of `idx` (elements of `index`) and the next of `with`,
/// the indices read a piece at a time in a tight loop per type.
fn each_index<T>(
    index: DType,
    idx: &[u8],
    mut with: impl Iterator<Item = T>,
    mut f: impl FnMut(i64, T),
) {
    let Ok(()) = dtype::by_piece(index, idx, |_, wide| {
        wide.iter().zip(with.by_ref()).for_each(|(&k, t)| f(k, t));
        Ok::<(), std::convert::Infallible>(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::bits::unpack_bits;
    use crate::sink::Sink;

    fn oh(axis: usize, classes: usize, dense: DType) -> OneHot {
        OneHot {
            axis,
            classes,
            index: index_dtype(classes),
            dense,
            map: false,
        }
    }

    fn encode(d: DType, values: &[i64]) -> Vec<u8> {
        let mut out = Vec::new();
        values
            .iter()
            .for_each(|&v| dtype::encode_i64(d, v, &mut out));
        out
    }

    #[test]
    fn indices_then_expand_give_back_the_dense_bytes_on_any_axis() {
        // [2, 3, 2] one-hot along axis 1 (3 classes); (1, *, 1) is a pad row.
        let dense = [0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        for d in [DType::Int64, DType::Float32, DType::Uint8, DType::Bfloat16] {
            let o = oh(1, 3, d);
            let x = Array::owned(d, vec![2, 3, 2], encode(d, &dense));
            let idx = indices("f", &x, &o).expect("valid");
            assert_eq!(idx.shape(), vec![2, 2]);
            assert_eq!(idx.to_bytes(), vec![1, 0, 2, 3]);
            assert_eq!(expand(&o, &idx.to_bytes(), &[2, 2]), encode(d, &dense));
        }
    }

    #[test]
    fn expansion_writes_every_byte_of_used_memory_over_many_pieces() {
        // 2500 rows of 5 classes (pieces of the index reads, several rows a zeroed group)
        // and 40 of 2100 (a row larger than a group), pads (-1) and indices past the
        // classes, the class axis last (rows written whole) and in the middle (zeros,
        // then ones).
        let cases = [
            (5, vec![vec![2500], vec![50, 50]]),
            (2100, vec![vec![40], vec![5, 8]]),
        ];
        for (classes, shapes) in cases {
            let rows = random_indices(shapes[0][0], classes);
            for (axis, compact) in [(1, &shapes[0]), (1, &shapes[1]), (2, &shapes[1])] {
                for d in [DType::Int64, DType::Float32, DType::Bool, DType::Bfloat16] {
                    let o = OneHot {
                        index: DType::Int16,
                        ..oh(axis, classes, d)
                    };
                    let dense = o.dense_shape(compact);
                    let (outer, inner) = o.around(&dense);
                    let want: Vec<i64> = (0..outer * classes * inner)
                        .map(|at| {
                            let (o_, k, i) =
                                (at / (classes * inner), at / inner % classes, at % inner);
                            i64::from(rows[o_ * inner + i] == k as i64)
                        })
                        .collect();
                    let mut out = vec![0xAB; want.len() * dtype::size(d)];
                    o.form()
                        .expand_into(&encode(DType::Int16, &rows), d, &dense, &mut out);
                    let case = format!("{classes} classes, axis {axis}, {compact:?}, {d:?}");
                    assert!(out == encode(d, &want), "{case}");
                }
            }
        }
    }

    /// `n` indices of `classes`, with pads (-1) and indices past the classes.
    fn random_indices(n: usize, classes: usize) -> Vec<i64> {
        let mut seed = 7u64;
        (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 33) as i64 % (classes as i64 + 2) - 1
            })
            .collect()
    }

    #[test]
    fn a_second_one_or_another_value_is_named_at_its_position() {
        let o = oh(1, 3, DType::Int64);
        let two = Array::owned(
            DType::Int64,
            vec![2, 3],
            encode(DType::Int64, &[0, 0, 1, 1, 0, 1]),
        );
        let e = indices("res", &two, &o).expect_err("two ones").to_string();
        assert!(
            e.contains("feature `res`, axis 1 (one-hot)")
                && e.contains("(classes 0 and 2) at [1, 2]"),
            "{e}"
        );
        let other = Array::owned(
            DType::Int64,
            vec![2, 3],
            encode(DType::Int64, &[0, 2, 0, 1, 0, 0]),
        );
        let e = indices("res", &other, &o).expect_err("a 2").to_string();
        assert!(e.contains("found 2 at [0, 1]"), "{e}");
    }

    #[test]
    fn maps_and_features_break_the_one_hot_rule_in_the_same_words() {
        // (shape, values, one-hot axis): a second 1 and a value not 0 or 1, on the last
        // axis and on one before it.
        let cases = [
            (vec![2, 3], vec![0, 0, 1, 1, 0, 1], 1),
            (vec![2, 3], vec![0, 2, 0, 1, 0, 0], 1),
            (vec![2, 3, 2], vec![0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 1], 1),
            (vec![2, 3, 2], vec![0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3], 1),
            (vec![2, 2], vec![1, 0, 0, 1], 1),
        ];
        let mut faults = 0;
        for (shape, values, axis) in cases {
            let x = Array::owned(DType::Int64, shape.clone(), encode(DType::Int64, &values));
            let o = oh(axis, shape[axis], DType::Int64);
            let feature = indices("f", &x, &o).err().map(|e| e.to_string());
            let map = check_map_rows("f", &x, axis).err().map(|e| e.to_string());
            assert_eq!(feature, map, "{shape:?} {values:?}");
            faults += usize::from(map.is_some());
        }
        assert_eq!(faults, 4);
    }

    #[test]
    fn a_mask_packed_into_bits_unpacks_to_its_bytes() {
        for d in [DType::Float32, DType::Bool, DType::Int64, DType::Bfloat16] {
            // Copied runs and filled pads of every alignment, 21 elements in all.
            let values = [1, 0, 1, 1, 0, 0, 0, 1, 1, 1];
            let mut packed = Vec::new();
            let mut bits = Bits::new(&mut packed, d);
            bits.copy(&encode(d, &values[..3])).expect("copy");
            bits.fill(&encode(d, &[1]), 9).expect("fill");
            bits.copy(&encode(d, &values[3..])).expect("copy");
            bits.fill(&encode(d, &[0]), 2).expect("fill");
            bits.finish().expect("finish");
            let mut want = values[..3].to_vec();
            want.extend([1; 9]);
            want.extend(&values[3..]);
            want.extend([0, 0]);
            assert_eq!(packed.len(), bits_len(want.len()));
            assert_eq!(unpack_bits(&packed, want.len(), d), encode(d, &want), "{d}");
        }
    }

    #[test]
    fn the_index_type_is_the_smallest_holding_every_class_and_none() {
        assert_eq!(index_dtype(33), DType::Uint8);
        assert_eq!(index_dtype(255), DType::Uint8);
        assert_eq!(index_dtype(256), DType::Int16);
        assert_eq!(index_dtype(40_000), DType::Int32);
    }
}
