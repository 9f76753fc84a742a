//! Any rectangular window of a feature's padded layout, written in one pass over its
//! bytes: the base runs that land in it are copied, only the pad regions are filled.
//! A rank's block is the window of its coordinates; the padded tensor is the whole
//! layout.

use std::io;
use std::ops::Range;

use crate::array::{Array, Sel, RELEASE_BYTES};
use crate::sink::Sink;

/// Where one axis' serial items go in the padded layout.
#[derive(Clone, Copy, Debug)]
pub struct AxisMap<'a> {
    /// The padded length.
    pub padded: usize,
    /// Position of every item; `None`: items keep their place and the end is padded.
    pub positions: Option<&'a [usize]>,
}

impl AxisMap<'_> {
    /// The padded position of serial item `i`.
    pub fn position(&self, i: usize) -> usize {
        self.positions.map_or(i, |p| p[i])
    }
}

/// A stretch of one axis of a window: `len` items from base item `src` on, or pads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Items in the stretch.
    pub len: usize,
    /// The first base item, `None` for pads.
    pub src: Option<usize>,
}

/// The pieces of one axis inside `window` (`(start, len)` of the padded axis), in
/// window order: runs of items consecutive in both the padded layout and the base.
pub(crate) fn pieces(sel: &Sel, axis: &AxisMap, (start, wlen): (usize, usize)) -> Vec<Piece> {
    let end = start + wlen;
    let items = items_in(sel, axis.positions, start..end);
    let mut out: Vec<Piece> = Vec::new();
    let mut at = start;
    for (p, b) in items {
        if p > at {
            out.push(Piece {
                len: p - at,
                src: None,
            });
        }
        match out.last_mut() {
            Some(Piece { len, src: Some(s) }) if p == at && *s + *len == b => *len += 1,
            _ => out.push(Piece {
                len: 1,
                src: Some(b),
            }),
        }
        at = p + 1;
    }
    if end > at {
        out.push(Piece {
            len: end - at,
            src: None,
        });
    }
    out
}

/// (padded position, base item) of every item of `sel` landing in `window` of the
/// padded axis, in window order. Items in order (none moved, or moved in order, as
/// owner-partitioned layouts move them) are found by their window's ends alone: a
/// block's time goes with its window, not with the whole axis.
fn items_in(sel: &Sel, positions: Option<&[usize]>, window: Range<usize>) -> Vec<(usize, usize)> {
    let n = sel.len();
    // Intake checked every axis against its semantic's length: a position per item.
    debug_assert!(positions.is_none_or(|p| p.len() >= n));
    let at = |p: &[usize], i: usize| (p[i], sel.get(i));
    match positions.map(|p| &p[..n.min(p.len())]) {
        None => (window.start.min(n)..window.end.min(n))
            .map(|i| (i, sel.get(i)))
            .collect(),
        Some(p) if p.is_sorted() => {
            let (lo, hi) = (
                p.partition_point(|&q| q < window.start),
                p.partition_point(|&q| q < window.end),
            );
            (lo..hi).map(|i| at(p, i)).collect()
        }
        Some(p) => {
            let mut items: Vec<(usize, usize)> = (0..p.len())
                .map(|i| at(p, i))
                .filter(|&(q, _)| window.contains(&q))
                .collect();
            items.sort_unstable();
            items
        }
    }
}

/// Writes the region `window` of `x`'s padded layout (`axes`) into `sink`, row-major;
/// pads are the element `pad`. A mapped base gives its pages back as it goes.
pub fn write_window(
    x: &Array,
    pad: &[u8],
    axes: &[AxisMap],
    window: &[(usize, usize)],
    sink: &mut impl Sink,
) -> io::Result<()> {
    let pieces: Vec<Vec<Piece>> = (0..x.dim())
        .map(|d| pieces(x.sel(d), &axes[d], window[d]))
        .collect();
    let base = x.base_shape();
    // Trailing axes copied whole are one contiguous run of the base.
    let whole = |d: usize| {
        pieces[d]
            == [Piece {
                len: base[d],
                src: Some(0),
            }]
    };
    let row = (0..x.dim()).rev().find(|&d| !whole(d));
    let Some(row) = row else {
        sink.copy(x.base_bytes())?;
        x.release_all();
        return Ok(());
    };
    let mut sub = vec![1usize; x.dim()];
    for d in (0..x.dim().saturating_sub(1)).rev() {
        sub[d] = sub[d + 1] * window[d + 1].1;
    }
    let mut w = Writer {
        x,
        pad,
        pieces: &pieces,
        strides: x.base_strides(),
        sub,
        row,
        sink,
        rows: None,
        since: 0,
    };
    w.emit(0, 0)?;
    w.release();
    Ok(())
}

/// [`write_window`] for a base known by its nonzero elements ([`Array::from_entries`]),
/// whose pads are zero: the elements landing in the window go to the sink as entries
/// ([`Sink::sparse`]), so the time goes with the window and the elements (with the
/// elements alone for a sink keeping entries), never with the base.
pub(crate) fn write_entries_window(
    x: &Array,
    axes: &[AxisMap],
    window: &[(usize, usize)],
    sink: &mut impl Sink,
) -> io::Result<()> {
    let Some(list) = x.entry_list() else {
        return Err(io::Error::other("not a base known by its entries"));
    };
    let base = x.base_shape();
    // Each base item's place in the window, per axis (`None`: outside it, or cut).
    let local: Vec<Vec<Option<usize>>> = (0..x.dim())
        .map(|d| {
            let mut at = vec![None; base[d]];
            let mut w = 0;
            for p in pieces(x.sel(d), &axes[d], window[d]) {
                if let Some(s) = p.src {
                    (0..p.len).for_each(|i| at[s + i] = Some(w + i));
                }
                w += p.len;
            }
            at
        })
        .collect();
    let lens: Vec<usize> = window.iter().map(|&(_, n)| n).collect();
    let mut found = Vec::new();
    'entry: for (&p, &v) in list.positions.iter().zip(&list.bits) {
        let (mut rest, mut flat, mut scale) = (p, 0, 1);
        for d in (0..x.dim()).rev() {
            let Some(l) = local[d][rest % base[d].max(1)] else {
                continue 'entry;
            };
            rest /= base[d].max(1);
            flat += l * scale;
            scale *= lens[d];
        }
        found.push((flat, v));
    }
    found.sort_unstable_by_key(|&(p, _)| p);
    let es = crate::dtype::size(x.dtype());
    sink.sparse(lens.iter().product(), es, &found)
}

struct Writer<'w, 'a, S> {
    x: &'w Array<'a>,
    pad: &'w [u8],
    pieces: &'w [Vec<Piece>],
    strides: Vec<usize>,
    /// Elements of the window below each axis.
    sub: Vec<usize>,
    /// The last axis not copied whole.
    row: usize,
    sink: &'w mut S,
    /// Base rows of axis 0 read and not yet given back.
    rows: Option<(usize, usize)>,
    since: usize,
}

impl<S: Sink> Writer<'_, '_, S> {
    fn emit(&mut self, d: usize, off: usize) -> io::Result<()> {
        let stride = self.strides[d];
        for k in 0..self.pieces[d].len() {
            let p = self.pieces[d][k];
            let Some(s) = p.src else {
                self.sink.fill(self.pad, p.len * self.sub[d])?;
                continue;
            };
            if d == self.row {
                let a = off + s * stride;
                self.sink
                    .copy(&self.x.base_bytes()[a..a + p.len * stride])?;
                self.since += p.len * stride;
                self.passed(d, s, p.len);
            } else {
                for i in 0..p.len {
                    self.emit(d + 1, off + (s + i) * stride)?;
                    self.passed(d, s + i, 1);
                }
            }
        }
        Ok(())
    }

    /// Base rows `s..s + n` of axis `d` are written: on axis 0, give back what has been
    /// read once it adds up to [`RELEASE_BYTES`].
    fn passed(&mut self, d: usize, s: usize, n: usize) {
        if d != 0 {
            return;
        }
        let (lo, hi) = self.rows.unwrap_or((s, s));
        self.rows = Some((lo.min(s), hi.max(s + n)));
        if self.since >= RELEASE_BYTES {
            self.release();
        }
    }

    /// Gives back the base rows read since the last time.
    fn release(&mut self) {
        if let Some((lo, hi)) = self.rows.take() {
            self.x.release_rows(lo, hi);
        }
        self.since = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::EntryList;
    use crate::dtype;
    use featshard_spec::ir::DType;

    fn map(padded: usize, positions: Option<&[usize]>) -> AxisMap<'_> {
        AxisMap { padded, positions }
    }

    proptest::proptest! {
        #[test]
        fn a_base_known_by_its_entries_gives_every_sink_the_dense_window(
            values in proptest::collection::vec(proptest::sample::select(vec![0i64, 0, 0, 3, -7]), 1..60),
            cols in 1usize..8,
            gaps in proptest::collection::vec(0usize..2, 8),
            (start, len) in (0usize..10, 0usize..12),
        ) {
            // A [rows, cols] int32 base, its columns moved in order with pads between,
            // as the dense base and as its nonzero elements.
            let rows = values.len().div_ceil(cols);
            let mut dense = values.clone();
            dense.resize(rows * cols, 0);
            let bytes: Vec<u8> = dense.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect();
            let nonzero: Vec<usize> = (0..dense.len()).filter(|&p| dense[p] != 0).collect();
            let bits = nonzero.iter().map(|&p| u64::from(dense[p] as i32 as u32)).collect();
            let list = EntryList { positions: nonzero, bits };
            let by_entries = Array::from_entries(DType::Int32, vec![rows, cols], list);
            let by_bytes = Array::owned(DType::Int32, vec![rows, cols], bytes);
            let pos: Vec<usize> = gaps[..cols].iter().enumerate().map(|(i, g)| i * 2 + g).collect();
            let axes = [map(rows + 1, None), map(cols * 2 + 1, Some(&pos))];
            let window = [(0, rows + 1), (start.min(cols * 2), len.min(cols * 2 + 1 - start.min(cols * 2)))];
            let mut want = Vec::new();
            write_window(&by_bytes, &[0; 4], &axes, &window, &mut want).unwrap();
            let mut plain = Vec::new();
            write_entries_window(&by_entries, &axes, &window, &mut plain).unwrap();
            proptest::prop_assert_eq!(&plain, &want);
            let mut slice = vec![0xAB; want.len()];
            write_entries_window(&by_entries, &axes, &window, &mut crate::sink::SliceSink::new(&mut slice)).unwrap();
            proptest::prop_assert_eq!(&slice, &want);
            let mut kept = crate::compact::Entries::new(DType::Int32);
            write_entries_window(&by_entries, &axes, &window, &mut kept).unwrap();
            let rows = kept.finish(want.len() / 4).unwrap();
            let mut expanded = vec![0xAB; want.len()];
            let shape = [window[0].1, window[1].1];
            crate::compact::Form::Sparse.expand_into(&rows, DType::Int32, &shape, &mut expanded);
            proptest::prop_assert_eq!(&expanded, &want);
        }

        #[test]
        fn items_in_a_window_are_those_a_scan_of_the_axis_finds(
            moves in proptest::collection::vec(0usize..3, 0..40),
            shuffle in proptest::bool::ANY,
            listed in proptest::bool::ANY,
            (start, len) in (0usize..130, 0usize..130),
        ) {
            // Positions in order (gaps of 0-2 pads), or the same positions out of order.
            let mut pos: Vec<usize> = moves.iter().scan(0, |at, &m| { *at += m + 1; Some(*at - 1) }).collect();
            if shuffle { pos.reverse(); }
            let n = pos.len();
            let sel = if listed { Sel::List((0..n).rev().collect::<Vec<_>>().into()) } else { Sel::Range { start: 0, len: n } };
            for positions in [None, Some(&pos[..])] {
                let mut want: Vec<(usize, usize)> = (0..n)
                    .map(|i| (positions.map_or(i, |p| p[i]), sel.get(i)))
                    .filter(|&(p, _)| (start..start + len).contains(&p))
                    .collect();
                want.sort_unstable();
                proptest::prop_assert_eq!(items_in(&sel, positions, start..start + len), want);
            }
        }
    }

    #[test]
    fn pieces_follow_positions_and_pads_fill_the_gaps() {
        let sel = Sel::Range { start: 0, len: 6 };
        let pos = [0, 1, 4, 5, 6, 9];
        let p = pieces(&sel, &map(12, Some(&pos)), (0, 12));
        let want = [
            (2, Some(0)),
            (2, None),
            (3, Some(2)),
            (2, None),
            (1, Some(5)),
            (2, None),
        ];
        let want: Vec<Piece> = want.iter().map(|&(len, src)| Piece { len, src }).collect();
        assert_eq!(p, want);
        // A window inside, and base items selected out of order.
        let sel = Sel::List([5, 4, 3, 0, 1, 2].into());
        let p = pieces(&sel, &map(12, Some(&pos)), (4, 4));
        let want = [(1, Some(3)), (2, Some(0)), (1, None)];
        let want: Vec<Piece> = want.iter().map(|&(len, src)| Piece { len, src }).collect();
        assert_eq!(p, want);
    }

    /// The naive reference: every element of the window looked up one by one.
    fn naive(x: &Array, pad: &[u8], axes: &[AxisMap], window: &[(usize, usize)]) -> Vec<u8> {
        let shape: Vec<usize> = window.iter().map(|w| w.1).collect();
        let n: usize = shape.iter().product();
        let es = dtype::size(x.dtype());
        let bytes = x.to_bytes();
        let xs = x.shape();
        let mut out = Vec::new();
        for flat in 0..n {
            let (mut rem, mut src) = (flat, Some(0usize));
            for d in (0..shape.len()).rev() {
                let p = window[d].0 + rem % shape[d];
                rem /= shape[d];
                let stride: usize = xs[d + 1..].iter().product();
                let item = (0..xs[d]).find(|&i| axes[d].position(i) == p);
                src = src.zip(item).map(|(s, i)| s + i * stride);
            }
            match src {
                Some(s) => out.extend_from_slice(&bytes[s * es..(s + 1) * es]),
                None => out.extend_from_slice(pad),
            }
        }
        out
    }

    #[test]
    fn every_window_equals_the_element_by_element_reference() {
        let mut bytes = Vec::new();
        for v in 0..(6 * 2 * 7) as i64 {
            dtype::encode_i64(DType::Int16, v, &mut bytes);
        }
        let base = Array::owned(DType::Int16, vec![6, 2, 7], bytes);
        let ordered = [0usize, 1, 2, 4, 5, 8];
        let scattered = [7usize, 0, 3, 9, 4, 1];
        let x = base.narrow(2, 1, 6);
        let axes = [
            map(10, Some(&ordered)),
            map(3, None),
            map(10, Some(&scattered)),
        ];
        let views = [x.clone(), x.select(0, &[5, 4, 3, 2, 1, 0])];
        let pad = (-1i16).to_le_bytes();
        let windows = |n: usize| {
            [
                (0, n),
                (0, n / 2),
                (n / 2, n - n / 2),
                (n / 3, n / 3),
                (n - 1, 1),
                (2, 0),
            ]
        };
        let mut checked = 0;
        for v in &views {
            for w0 in windows(10) {
                for w1 in windows(3) {
                    for w2 in windows(10) {
                        let window = [w0, w1, w2];
                        let mut got = Vec::new();
                        write_window(v, &pad, &axes, &window, &mut got).unwrap();
                        assert_eq!(got, naive(v, &pad, &axes, &window), "window {window:?}");
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 6 * 6 * 6);
        // A whole, unpadded view is one copy of its base.
        let whole = [map(6, None), map(2, None), map(7, None)];
        let mut got = Vec::new();
        write_window(&base, &pad, &whole, &[(0, 6), (0, 2), (0, 7)], &mut got).unwrap();
        assert_eq!(got, base.base_bytes());
    }
}
