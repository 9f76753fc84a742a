//! Ranged integer features (`range: [lo, hi]`): every value is checked to lie in the
//! range, and blocks travel and rest in the smallest integer type holding it.

use std::io;

use featshard_spec::ir::DType;
use featshard_spec::plan::TensorPlan;

use super::SCAN_CHUNK;
use crate::array::Array;
use crate::dtype;
use crate::error::ExecError;
use crate::sink::Sink;
use featshard_spec::layout::unravel;

/// The smallest integer type holding `lo..=hi` narrower than `dense`, if any.
pub(crate) fn narrow_dtype(dense: DType, [lo, hi]: [i64; 2]) -> Option<DType> {
    [DType::Uint8, DType::Int8, DType::Int16, DType::Int32]
        .into_iter()
        .find(|d| d.int_range().is_some_and(|(a, b)| a <= lo && hi <= b))
        .filter(|&d| dtype::size(d) < dtype::size(dense))
}

/// The type feature `t`'s blocks are narrowed to, if it declares a range a narrower
/// type holds.
pub fn narrowed(t: &TensorPlan) -> Option<DType> {
    narrow_dtype(t.dtype, t.range?)
}

/// Checks every value of ranged feature `name` (`x`) lies in `[lo, hi]`, naming the
/// first that does not and its position.
pub(crate) fn check_range(name: &str, x: &Array, [lo, hi]: [i64; 2]) -> Result<(), ExecError> {
    let x = x.contiguous();
    let (d, es) = (x.dtype(), dtype::size(x.dtype()));
    let bytes = x.base_bytes();
    for (c, chunk) in bytes.chunks(SCAN_CHUNK).enumerate() {
        let (min, max) = min_max(d, chunk);
        if min < lo || max > hi {
            let (k, v) = chunk
                .chunks_exact(es)
                .map(|e| dtype::read_i64(d, e))
                .enumerate()
                .find(|&(_, v)| v < lo || v > hi)
                .unwrap_or((0, min));
            return Err(ExecError::Range {
                feature: name.to_owned(),
                value: v,
                at: unravel(c * SCAN_CHUNK / es + k, &x.shape()),
                range: [lo, hi],
            });
        }
        x.release_bytes(c * SCAN_CHUNK, c * SCAN_CHUNK + chunk.len());
    }
    Ok(())
}

/// The least and greatest element of `bytes` (elements of integer dtype `d`), one tight
/// loop per type so that it runs near memory bandwidth.
fn min_max(d: DType, bytes: &[u8]) -> (i64, i64) {
    macro_rules! each {
        ($t:ty) => {{
            const N: usize = std::mem::size_of::<$t>();
            bytes
                .chunks_exact(N)
                .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or([0; N])))
                .fold((<$t>::MAX, <$t>::MIN), |(a, b), v| (a.min(v), b.max(v)))
        }};
    }
    let wide = |(a, b): (i64, i64)| if a > b { (0, 0) } else { (a, b) };
    wide(match d {
        DType::Bool | DType::Uint8 => {
            let (a, b) = each!(u8);
            (i64::from(a), i64::from(b))
        }
        DType::Int8 => {
            let (a, b) = each!(i8);
            (i64::from(a), i64::from(b))
        }
        DType::Int16 => {
            let (a, b) = each!(i16);
            (i64::from(a), i64::from(b))
        }
        DType::Int32 => {
            let (a, b) = each!(i32);
            (i64::from(a), i64::from(b))
        }
        _ => each!(i64),
    })
}

/// A sink that writes elements of `from` as elements of `to`, one integer value at a
/// time: a ranged block narrowed, or a block given narrower (a mask as `bool`, ranged
/// ids as `uint8`) widened to its declared dtype. The values fit: checked on intake.
#[derive(Debug)]
pub(crate) struct Cast<'o, S> {
    out: &'o mut S,
    from: DType,
    to: DType,
    buf: Vec<u8>,
}

impl<'o, S: Sink> Cast<'o, S> {
    /// Writes into `out` what is written into it, `from` cast `to`.
    pub fn new(out: &'o mut S, from: DType, to: DType) -> Self {
        Cast {
            out,
            from,
            to,
            buf: Vec::new(),
        }
    }
}

impl<S: Sink> Sink for Cast<'_, S> {
    fn copy(&mut self, bytes: &[u8]) -> io::Result<()> {
        // Bounded pieces keep the conversion buffer small.
        let (fs, ts) = (dtype::size(self.from), dtype::size(self.to));
        for piece in bytes.chunks(fs << 16) {
            self.buf.resize(piece.len() / fs * ts, 0);
            dtype::cast(self.from, piece, self.to, &mut self.buf);
            self.out.copy(&self.buf)?;
        }
        Ok(())
    }

    fn fill(&mut self, pad: &[u8], count: usize) -> io::Result<()> {
        let mut one = vec![0; dtype::size(self.to)];
        dtype::cast(self.from, pad, self.to, &mut one);
        self.out.fill(&one, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_narrowest_type_holds_the_range() {
        assert_eq!(narrow_dtype(DType::Int64, [0, 32]), Some(DType::Uint8));
        assert_eq!(narrow_dtype(DType::Int64, [-1, 100]), Some(DType::Int8));
        assert_eq!(narrow_dtype(DType::Int64, [-1, 300]), Some(DType::Int16));
        assert_eq!(narrow_dtype(DType::Int16, [0, 70_000]), None);
        assert_eq!(narrow_dtype(DType::Uint8, [0, 3]), None);
    }

    #[test]
    fn a_value_outside_the_range_is_named_at_its_position() {
        let mut bytes = Vec::new();
        for v in [0i64, 5, 32, 1, 33, 2] {
            bytes.extend(v.to_le_bytes());
        }
        let x = Array::owned(DType::Int64, vec![2, 3], bytes);
        let e = check_range("msa", &x, [0, 32]).expect_err("33").to_string();
        assert!(
            e.contains("`msa`") && e.contains("33 at [1, 1]") && e.contains("[0, 32]"),
            "{e}"
        );
        assert!(check_range("msa", &x, [0, 33]).is_ok());
    }
}
