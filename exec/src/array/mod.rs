//! One feature's values as a view: a contiguous row-major base (bytes of a memory map,
//! or owned) and, per axis, which base items the view holds. Cutting incoming pads and
//! dropping unowned rows select items; nothing is copied until a block is written.

mod sparse;

use std::sync::{Arc, OnceLock};

use featshard_spec::ir::DType;

use crate::dtype::{decode_into, size};
use crate::mapping::Pages;
use sparse::Sparse;

/// The base items one axis of a view holds, in view order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sel {
    /// Items `start..start + len`.
    #[allow(missing_docs)]
    Range { start: usize, len: usize },
    /// These items.
    List(Arc<[usize]>),
}

impl Sel {
    /// How many items the axis holds.
    pub fn len(&self) -> usize {
        match self {
            Sel::Range { len, .. } => *len,
            Sel::List(items) => items.len(),
        }
    }

    /// Whether the axis holds no item.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The base item of view item `i` (`i < len`).
    pub fn get(&self, i: usize) -> usize {
        match self {
            Sel::Range { start, .. } => start + i,
            Sel::List(items) => items[i],
        }
    }

    fn narrow(&self, start: usize, len: usize) -> Sel {
        match self {
            Sel::Range { start: s, .. } => Sel::Range {
                start: s + start,
                len,
            },
            Sel::List(items) => Sel::List(items[start..start + len].into()),
        }
    }
}

#[derive(Clone, Debug)]
enum Base<'a> {
    Mapped(&'a [u8], Option<Pages<'a>>),
    Owned(Arc<Vec<u8>>),
}

/// A feature's values (see the module documentation). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Array<'a> {
    dtype: DType,
    base: Base<'a>,
    base_shape: Vec<usize>,
    sel: Vec<Sel>,
    /// The base's nonzero entries, once a check asked for them (`None`: not sparse).
    sparse: Arc<OnceLock<Option<Sparse>>>,
    /// The base has no bytes, only `sparse` ([`Array::one_hot_rows`]).
    rows_only: bool,
    /// A rows-only or entries-only base's dense bytes, made only if something reads
    /// bytes.
    dense: Arc<OnceLock<Vec<u8>>>,
    /// The base has no bytes, only its nonzero elements ([`Array::from_entries`]).
    entries: Option<Arc<EntryList>>,
}

/// A base known by its nonzero elements: each one's flat position in the base,
/// ascending, and its bits (little-endian, widened to 64).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EntryList {
    /// Flat base positions, ascending.
    pub positions: Vec<usize>,
    /// The element at each position, its bits widened.
    pub bits: Vec<u64>,
}

impl<'a> Array<'a> {
    /// A view of all of `bytes` (row-major, `shape`, whole elements of `dtype`), whose
    /// pages `pages` gives back once read.
    pub fn borrowed(
        dtype: DType,
        shape: Vec<usize>,
        bytes: &'a [u8],
        pages: Option<Pages<'a>>,
    ) -> Self {
        Self::new(dtype, shape, Base::Mapped(bytes, pages))
    }

    /// An array owning its row-major bytes.
    pub fn owned(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> Array<'static> {
        Array::new(dtype, shape, Base::Owned(Arc::new(bytes)))
    }

    /// A one-hot map known by the column of each row's 1 (`None`: a row of zeros),
    /// `cols` columns wide, whose dense bytes are never made: its rows are read through
    /// [`Array::for_each_row_nonzero`], and it is written from its indices (see
    /// [`Array::is_rows_only`]).
    pub(crate) fn one_hot_rows(
        dtype: DType,
        rows: &[Option<usize>],
        cols: usize,
    ) -> Array<'static> {
        let mut a = Array::new(dtype, vec![rows.len(), cols], Base::Owned(Arc::default()));
        let sparse = Sparse::from_rows(rows);
        a.sparse = Arc::new(OnceLock::from(Some(sparse)));
        a.rows_only = true;
        a
    }

    /// A sparse feature given as its nonzero elements (`list`, of a base of `shape`),
    /// whose dense bytes are never made by the executor's own paths: blocks are written
    /// from the entries ([`crate::window::write_entries_window`]).
    pub(crate) fn from_entries(dtype: DType, shape: Vec<usize>, list: EntryList) -> Array<'static> {
        let mut a = Array::new(dtype, shape, Base::Owned(Arc::default()));
        a.entries = Some(Arc::new(list));
        a
    }

    /// The nonzero elements of a base given as them ([`Array::from_entries`]).
    pub fn entry_list(&self) -> Option<&EntryList> {
        self.entries.as_deref()
    }

    /// Whether the array has no bytes, only its rows' nonzero entries
    /// ([`Array::one_hot_rows`]): read it by its nonzero entries only.
    pub fn is_rows_only(&self) -> bool {
        self.rows_only
    }

    fn new(dtype: DType, shape: Vec<usize>, base: Base<'a>) -> Self {
        let sel = shape
            .iter()
            .map(|&len| Sel::Range { start: 0, len })
            .collect();
        Array {
            dtype,
            base,
            base_shape: shape,
            sel,
            sparse: Arc::default(),
            rows_only: false,
            dense: Arc::default(),
            entries: None,
        }
    }

    /// The element dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The view's shape.
    pub fn shape(&self) -> Vec<usize> {
        self.sel.iter().map(Sel::len).collect()
    }

    /// Number of axes.
    pub fn dim(&self) -> usize {
        self.sel.len()
    }

    /// Number of elements in the view.
    pub fn numel(&self) -> usize {
        self.sel.iter().map(Sel::len).product()
    }

    /// The base items of axis `d`.
    pub fn sel(&self, d: usize) -> &Sel {
        &self.sel[d]
    }

    /// The shape of the base the view selects from.
    pub fn base_shape(&self) -> &[usize] {
        &self.base_shape
    }

    /// The base's bytes. A rows-only base ([`Array::one_hot_rows`]) makes its dense
    /// bytes the first time they are asked for: the executor's own paths read such a
    /// map by its rows and write it from its indices, so only a caller that wants the
    /// dense values (a tensor of it) pays for them.
    pub fn base_bytes(&self) -> &[u8] {
        if self.rows_only {
            return self.dense.get_or_init(|| self.dense_of_rows());
        }
        if let Some(list) = &self.entries {
            return self.dense.get_or_init(|| dense_of_entries(self, list));
        }
        match &self.base {
            Base::Mapped(b, _) => b,
            Base::Owned(v) => v,
        }
    }

    /// The dense row-major bytes of a rows-only base.
    fn dense_of_rows(&self) -> Vec<u8> {
        let (rows, cols) = (self.base_shape[0], self.base_shape[1]);
        let es = size(self.dtype);
        let mut one = Vec::with_capacity(es);
        crate::dtype::encode_i64(self.dtype, 1, &mut one);
        let mut out = vec![0u8; rows * cols * es];
        if let Some(Some(sparse)) = self.sparse.get() {
            for r in 0..rows {
                for (c, _) in sparse.row(r) {
                    out[(r * cols + c) * es..][..es].copy_from_slice(&one);
                }
            }
        }
        out
    }

    /// Bytes between consecutive items of every base axis.
    pub(crate) fn base_strides(&self) -> Vec<usize> {
        let mut s = vec![size(self.dtype); self.base_shape.len()];
        for d in (0..s.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * self.base_shape[d + 1];
        }
        s
    }

    /// The base byte offset of view index `idx` on its first `idx.len()` axes.
    fn offset(&self, idx: &[usize], strides: &[usize]) -> usize {
        idx.iter()
            .enumerate()
            .map(|(d, &i)| self.sel[d].get(i) * strides[d])
            .sum()
    }

    /// Items `start..start + len` of axis `d` (within the view's length).
    pub fn narrow(&self, d: usize, start: usize, len: usize) -> Self {
        let mut out = self.clone();
        out.sel[d] = self.sel[d].narrow(start, len);
        out
    }

    /// Items `items` (each within the view's length) of axis `d`, in that order.
    pub fn select(&self, d: usize, items: &[usize]) -> Self {
        let mut out = self.clone();
        let s = &self.sel[d];
        out.sel[d] = Sel::List(items.iter().map(|&i| s.get(i)).collect());
        out
    }

    /// Whether `other` views the same base (memory) as this array.
    pub fn same_base(&self, other: &Array) -> bool {
        let (a, b) = (self.base_bytes(), other.base_bytes());
        a.as_ptr() == b.as_ptr() && a.len() == b.len() && self.base_shape == other.base_shape
    }

    /// Whether the view is its whole base, in order.
    pub(crate) fn is_whole(&self) -> bool {
        self.sel
            .iter()
            .zip(&self.base_shape)
            .all(|(s, &n)| *s == Sel::Range { start: 0, len: n })
    }

    /// Calls `f` with each row of the last axis (the whole view for a 0-D array), in
    /// row-major order: the outer index and the row's values as `f64`. A mapped base
    /// gives back its pages as the rows go by.
    pub(crate) fn for_each_row<E>(
        &self,
        mut f: impl FnMut(&[usize], &[f64]) -> Result<(), E>,
    ) -> Result<(), E> {
        let shape = self.shape();
        if shape.contains(&0) {
            return Ok(());
        }
        let bytes = self.base_bytes();
        let es = size(self.dtype);
        let strides = self.base_strides();
        let Some((&inner, outer)) = shape.split_last() else {
            let mut v = Vec::with_capacity(1);
            decode_into(self.dtype, &bytes[..es], &mut v);
            return f(&[], &v);
        };
        let last = &self.sel[outer.len()];
        let mut idx = vec![0usize; outer.len()];
        let mut row = Vec::with_capacity(inner);
        let mut released = Released::default();
        loop {
            let off = self.offset(&idx, &strides);
            row.clear();
            match last {
                Sel::Range { start, len } => {
                    let a = off + start * es;
                    decode_into(self.dtype, &bytes[a..a + len * es], &mut row);
                }
                Sel::List(items) => {
                    for &i in items.iter() {
                        let a = off + i * es;
                        decode_into(self.dtype, &bytes[a..a + es], &mut row);
                    }
                }
            }
            f(&idx, &row)?;
            let Some(d) = (0..idx.len()).rev().find(|&d| idx[d] + 1 < shape[d]) else {
                break;
            };
            if d == 0 {
                released.step(self, idx[0]);
            }
            idx[d] += 1;
            idx[d + 1..].fill(0);
        }
        self.release_all();
        Ok(())
    }

    /// The bytes of the view's row (its last axis) at outer index `idx`, when that axis
    /// holds a run of base items (`None` when it selects items out of order); a 0-D
    /// view's one element.
    pub(crate) fn row_bytes(&self, idx: &[usize]) -> Option<&[u8]> {
        let es = size(self.dtype);
        let bytes = self.base_bytes();
        let Some(last) = self.sel.last() else {
            return bytes.get(..es);
        };
        let Sel::Range { start, len } = last else {
            return None;
        };
        let off = self.offset(idx, &self.base_strides()) + start * es;
        bytes.get(off..off + len * es)
    }

    /// [`for_each_row`](Self::for_each_row), with only the nonzero entries of each row
    /// (column, value): a one-hot map's rows of zeros are skipped a block of bytes at a
    /// time, never decoded.
    pub(crate) fn for_each_row_nonzero<E>(
        &self,
        mut f: impl FnMut(&[usize], &[(usize, f64)]) -> Result<(), E>,
    ) -> Result<(), E> {
        let last = self.dim().checked_sub(1);
        let Some((last, sparse)) = last.and_then(|l| Some((l, self.sparse()?))) else {
            return self.for_each_row(|idx, row| {
                let nz: Vec<(usize, f64)> = row
                    .iter()
                    .enumerate()
                    .filter(|(_, &v)| v != 0.0)
                    .map(|(j, &v)| (j, v))
                    .collect();
                f(idx, &nz)
            });
        };
        // Base row numbers of the outer axes, and each base column's view column.
        let mut row_of = vec![1usize; last];
        for d in (0..last.saturating_sub(1)).rev() {
            row_of[d] = row_of[d + 1] * self.base_shape[d + 1];
        }
        let mut view_col = vec![None; self.base_shape[last]];
        for j in 0..self.sel[last].len() {
            view_col[self.sel[last].get(j)] = Some(j);
        }
        let mut nz = Vec::new();
        self.for_each_outer(
            |idx| {
                let r: usize = (0..last).map(|d| self.sel[d].get(idx[d]) * row_of[d]).sum();
                nz.clear();
                nz.extend(sparse.row(r).filter_map(|(c, v)| Some((view_col[c]?, v))));
                nz.sort_unstable_by_key(|e| e.0);
                f(idx, &nz)
            },
            last,
        )
    }

    /// The base's nonzero entries, found on first use; `None` when it is not sparse.
    fn sparse(&self) -> Option<&Sparse> {
        self.sparse
            .get_or_init(|| {
                let bytes = self.base_bytes();
                Sparse::build(self.dtype, &self.base_shape, bytes, |a, b| {
                    if let Base::Mapped(_, Some(pages)) = &self.base {
                        pages.release(&bytes[a..b]);
                    }
                })
            })
            .as_ref()
    }

    /// Calls `f` with every index of the first `n` axes, row-major, giving back the
    /// pages of a mapped base as axis 0 goes by.
    fn for_each_outer<E>(
        &self,
        mut f: impl FnMut(&[usize]) -> Result<(), E>,
        n: usize,
    ) -> Result<(), E> {
        let shape = self.shape();
        if shape.contains(&0) {
            return Ok(());
        }
        let mut idx = vec![0usize; n];
        let mut released = Released::default();
        loop {
            f(&idx)?;
            let Some(d) = (0..n).rev().find(|&d| idx[d] + 1 < shape[d]) else {
                break;
            };
            if d == 0 {
                released.step(self, idx[0]);
            }
            idx[d] += 1;
            idx[d + 1..].fill(0);
        }
        self.release_all();
        Ok(())
    }

    /// The first element (flat row-major index, value) that is none of `allowed`, compared
    /// as bit patterns of the dtype (a float `-0.0` counts as `0.0`; NaN is never
    /// allowed): a branch-free pass over the raw bytes, for large masks.
    pub(crate) fn first_outside(&self, allowed: [f64; 2]) -> Option<(usize, f64)> {
        let es = size(self.dtype);
        let mut ok = [0u64; 3];
        for (k, v) in [
            allowed[0],
            allowed[1],
            if allowed.contains(&0.0) {
                -0.0
            } else {
                allowed[0]
            },
        ]
        .into_iter()
        .enumerate()
        {
            let mut b = Vec::with_capacity(8);
            crate::dtype::encode_f64(self.dtype, v, &mut b);
            b.resize(8, 0);
            ok[k] = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        }
        let inner = self.shape().last().copied().unwrap_or(1);
        let (mut row, mut found) = (0usize, None);
        let _ = self.for_each_row_bytes(|_, bytes| {
            if let Some(j) = first_bad(es, bytes, ok) {
                let mut v = Vec::with_capacity(1);
                decode_into(self.dtype, &bytes[j * es..(j + 1) * es], &mut v);
                found = Some((row * inner + j, v[0]));
                return Err(());
            }
            row += 1;
            Ok(())
        });
        found
    }

    /// Calls `f` with the raw bytes of each row of the last axis (gathered when that axis
    /// selects items out of order), giving back a mapped base's pages as it goes.
    fn for_each_row_bytes<E>(
        &self,
        mut f: impl FnMut(&[usize], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let es = size(self.dtype);
        let (strides, bytes) = (self.base_strides(), self.base_bytes());
        let Some(last) = self.dim().checked_sub(1) else {
            return f(&[], &bytes[..es.min(bytes.len())]);
        };
        let mut gathered = Vec::new();
        self.for_each_outer(
            |idx| {
                let off = self.offset(idx, &strides);
                match &self.sel[last] {
                    Sel::Range { start, len } => {
                        f(idx, &bytes[off + start * es..off + (start + len) * es])
                    }
                    Sel::List(items) => {
                        gathered.clear();
                        for &i in items.iter() {
                            gathered.extend_from_slice(&bytes[off + i * es..off + (i + 1) * es]);
                        }
                        f(idx, &gathered)
                    }
                }
            },
            last,
        )
    }

    /// Every value of the view as `f64`, row-major (for small features).
    pub fn values(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.numel());
        let _ = self.for_each_row(|_, row| {
            out.extend_from_slice(row);
            Ok::<(), ()>(())
        });
        out
    }

    /// The view's bytes, row-major, in a new buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        if self.is_whole() {
            return self.base_bytes().to_vec();
        }
        let mut out = Vec::with_capacity(self.numel() * size(self.dtype));
        let bytes = self.base_bytes();
        let (es, strides) = (size(self.dtype), self.base_strides());
        let shape = self.shape();
        if shape.contains(&0) {
            return out;
        }
        let mut idx = vec![0usize; shape.len()];
        loop {
            let off = self.offset(&idx, &strides);
            out.extend_from_slice(&bytes[off..off + es]);
            let Some(d) = (0..idx.len()).rev().find(|&d| idx[d] + 1 < shape[d]) else {
                break;
            };
            idx[d] += 1;
            idx[d + 1..].fill(0);
        }
        out
    }

    /// The view as a whole array of its own (a copy unless it already is one).
    pub fn contiguous(&self) -> Array<'a> {
        if self.is_whole() {
            return self.clone();
        }
        Array::new(
            self.dtype,
            self.shape(),
            Base::Owned(Arc::new(self.to_bytes())),
        )
    }

    /// Gives back the pages of base rows (axis 0) `from..to` of a mapped base.
    pub(crate) fn release_rows(&self, from: usize, to: usize) {
        let Base::Mapped(bytes, Some(pages)) = &self.base else {
            return;
        };
        let row = self.base_strides().first().copied().unwrap_or(bytes.len());
        let (a, b) = ((from * row).min(bytes.len()), (to * row).min(bytes.len()));
        pages.release(&bytes[a..b]);
    }

    /// Gives back the pages of base bytes `from..to` of a mapped base.
    pub(crate) fn release_bytes(&self, from: usize, to: usize) {
        if let Base::Mapped(bytes, Some(pages)) = &self.base {
            let (a, b) = (from.min(bytes.len()), to.min(bytes.len()));
            pages.release(&bytes[a..b]);
        }
    }

    /// Gives back every page of a mapped base.
    pub(crate) fn release_all(&self) {
        if let Base::Mapped(bytes, Some(pages)) = &self.base {
            pages.release(bytes);
        }
    }
}

/// The dense row-major bytes of a base given as its entries.
fn dense_of_entries(x: &Array, list: &EntryList) -> Vec<u8> {
    let es = size(x.dtype);
    let mut out = vec![0u8; x.base_shape.iter().product::<usize>() * es];
    for (&p, &v) in list.positions.iter().zip(&list.bits) {
        if let Some(e) = out.get_mut(p * es..(p + 1) * es) {
            e.copy_from_slice(&v.to_le_bytes()[..es]);
        }
    }
    out
}

/// The nonzero elements of `bytes` (column, value), skipping all-zero blocks unread.
pub(crate) fn nonzeros(d: DType, bytes: &[u8], out: &mut Vec<(usize, f64)>) {
    const BLOCK: usize = 64;
    let es = size(d);
    let mut values = Vec::with_capacity(8);
    let mut take = |at: usize, part: &[u8], out: &mut Vec<(usize, f64)>| {
        values.clear();
        decode_into(d, part, &mut values);
        let first = at / es;
        out.extend(
            values
                .iter()
                .enumerate()
                .filter(|(_, &v)| v != 0.0)
                .map(|(k, &v)| (first + k, v)),
        );
    };
    let blocks = bytes.chunks_exact(BLOCK);
    let tail = blocks.remainder();
    for (b, block) in blocks.enumerate() {
        // Eight words tested at once; only the words holding a value are decoded.
        let words: [u64; 8] = std::array::from_fn(|w| {
            u64::from_ne_bytes(block[w * 8..w * 8 + 8].try_into().unwrap_or([0xff; 8]))
        });
        if words.iter().fold(0, |a, &w| a | w) == 0 {
            continue;
        }
        for w in (0..8).filter(|&w| words[w] != 0) {
            take(b * BLOCK + w * 8, &block[w * 8..w * 8 + 8], out);
        }
    }
    if !all_zero(tail) {
        take(bytes.len() - tail.len(), tail, out);
    }
}

/// The first element of `row` (elements of `es` bytes) whose bits are none of `ok`.
fn first_bad(es: usize, row: &[u8], ok: [u64; 3]) -> Option<usize> {
    macro_rules! scan {
        ($t:ty, $n:literal) => {{
            let [a, b, c] = ok.map(|o| o as $t);
            let value = |e: &[u8]| <$t>::from_le_bytes(e.try_into().unwrap_or([0; $n]));
            let bad = |v: $t| (v != a) & (v != b) & (v != c);
            const BLOCK: usize = 1024;
            for (k, block) in row.chunks(BLOCK * $n).enumerate() {
                let any = block
                    .chunks_exact($n)
                    .fold(false, |acc, e| acc | bad(value(e)));
                if any {
                    let j = block.chunks_exact($n).position(|e| bad(value(e)));
                    return j.map(|j| k * BLOCK + j);
                }
            }
            None
        }};
    }
    match es {
        1 => scan!(u8, 1),
        2 => scan!(u16, 2),
        4 => scan!(u32, 4),
        _ => scan!(u64, 8),
    }
}

/// Whether every byte is 0, a word at a time.
fn all_zero(block: &[u8]) -> bool {
    let words = block.chunks_exact(8);
    let tail = words.remainder().iter().fold(0u8, |a, &x| a | x);
    let or = words.fold(0u64, |a, w| {
        a | u64::from_ne_bytes(w.try_into().unwrap_or([0xff; 8]))
    });
    or == 0 && tail == 0
}

/// Bytes of a mapped base read before they are given back.
pub(crate) const RELEASE_BYTES: usize = 8 << 20;

/// The rows of axis 0 a scan has passed and not yet given back.
#[derive(Default)]
pub(crate) struct Released {
    from: Option<usize>,
}

impl Released {
    /// View row `i` of axis 0 is done: give back the base rows passed so far once they
    /// hold more than [`RELEASE_BYTES`] (only for an axis read in base order).
    pub(crate) fn step(&mut self, x: &Array, i: usize) {
        let Sel::Range { start, .. } = x.sel[0] else {
            return;
        };
        let row = x.base_strides().first().copied().unwrap_or(0).max(1);
        let from = *self.from.get_or_insert(start);
        let to = start + i + 1;
        if (to - from) * row >= RELEASE_BYTES {
            x.release_rows(from, to);
            self.from = Some(to);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::encode_i64;

    fn ints(shape: Vec<usize>) -> Array<'static> {
        let n: usize = shape.iter().product();
        let mut bytes = Vec::new();
        for v in 0..n as i64 {
            encode_i64(DType::Int32, v, &mut bytes);
        }
        Array::owned(DType::Int32, shape, bytes)
    }

    #[test]
    fn narrowed_and_selected_views_read_the_items_they_name() {
        let x = ints(vec![3, 4]);
        assert_eq!(x.values(), (0..12).map(f64::from).collect::<Vec<_>>());
        let y = x.narrow(1, 1, 2).select(0, &[2, 0]);
        assert_eq!(y.shape(), vec![2, 2]);
        assert_eq!(y.values(), vec![9.0, 10.0, 1.0, 2.0]);
        let back: Vec<i32> = y
            .to_bytes()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(back, vec![9, 10, 1, 2]);
        assert!(!y.is_whole() && x.is_whole() && y.contiguous().is_whole());
        assert!(x.narrow(0, 1, 0).values().is_empty());
        // The first value outside {0, 1}, by bit pattern, row-major through a view.
        assert_eq!(x.first_outside([0.0, 1.0]), Some((2, 2.0)));
        assert_eq!(
            x.select(1, &[1, 0]).first_outside([0.0, 1.0]),
            Some((2, 5.0))
        );
        let mut f = Vec::new();
        for v in [1.0f32, -0.0, 0.0, 1.0, f32::NAN, 0.5] {
            f.extend(v.to_le_bytes());
        }
        let f = Array::owned(DType::Float32, vec![2, 3], f);
        assert_eq!(f.narrow(0, 0, 1).first_outside([0.0, 1.0]), None);
        assert!(matches!(f.first_outside([0.0, 1.0]), Some((4, v)) if v.is_nan()));
        // Nonzero entries, read by blocks of bytes or (a selected last axis) by value:
        // a one-hot-like map whose rows span several blocks of zeros.
        let mut bytes = Vec::new();
        for i in 0..5 * 40i64 {
            let v = if i % 40 == (i / 40) * 9 { 1 } else { 0 };
            encode_i64(DType::Int64, if i == 77 { -3 } else { v }, &mut bytes);
        }
        let map = Array::owned(DType::Int64, vec![5, 40], bytes);
        for v in [
            x.clone(),
            x.select(1, &[3, 0, 1]),
            map.clone(),
            map.narrow(1, 5, 30),
            map.select(1, &[30, 2, 9, 0, 18]).narrow(0, 1, 4),
        ] {
            let mut dense = Vec::new();
            v.for_each_row(|idx, row| {
                for (j, &r) in row.iter().enumerate().filter(|(_, &r)| r != 0.0) {
                    dense.push((idx.to_vec(), j, r));
                }
                Ok::<(), ()>(())
            })
            .unwrap();
            let mut sparse = Vec::new();
            v.for_each_row_nonzero(|idx, nz| {
                sparse.extend(nz.iter().map(|&(j, r)| (idx.to_vec(), j, r)));
                Ok::<(), ()>(())
            })
            .unwrap();
            assert_eq!(sparse, dense);
        }
    }
}
