//! Spec dtypes as safetensors stores them: element sizes, names, and values read from
//! and written to little-endian bytes.

use featshard_spec::ir::{DType, PadValue};
use safetensors::Dtype;

/// Bytes per element.
pub fn size(d: DType) -> usize {
    match d {
        DType::Bool | DType::Uint8 | DType::Int8 => 1,
        DType::Int16 | DType::Float16 | DType::Bfloat16 => 2,
        DType::Int32 | DType::Float32 => 4,
        DType::Int64 | DType::Float64 => 8,
    }
}

/// The spec dtype of a safetensors dtype; `None` for one no spec can declare.
pub fn from_safetensors(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::Uint8,
        Dtype::I8 => DType::Int8,
        Dtype::I16 => DType::Int16,
        Dtype::I32 => DType::Int32,
        Dtype::I64 => DType::Int64,
        Dtype::F16 => DType::Float16,
        Dtype::BF16 => DType::Bfloat16,
        Dtype::F32 => DType::Float32,
        Dtype::F64 => DType::Float64,
        _ => return None,
    })
}

/// The safetensors dtype of a spec dtype.
pub fn to_safetensors(d: DType) -> Dtype {
    match d {
        DType::Bool => Dtype::BOOL,
        DType::Uint8 => Dtype::U8,
        DType::Int8 => Dtype::I8,
        DType::Int16 => Dtype::I16,
        DType::Int32 => Dtype::I32,
        DType::Int64 => Dtype::I64,
        DType::Float16 => Dtype::F16,
        DType::Bfloat16 => Dtype::BF16,
        DType::Float32 => Dtype::F32,
        DType::Float64 => Dtype::F64,
    }
}

/// The elements of `bytes` (whole elements of `d`) appended to `out` as `f64`: exact for
/// every value of every dtype but 64-bit integers beyond 2^53, which no check here
/// compares (counts, ids and masks are far smaller).
pub fn decode_into(d: DType, bytes: &[u8], out: &mut Vec<f64>) {
    macro_rules! each {
        ($n:literal, $f:expr) => {
            out.extend(bytes.chunks_exact($n).map(|c| {
                let a: [u8; $n] = c.try_into().unwrap_or([0; $n]);
                $f(a)
            }))
        };
    }
    match d {
        DType::Bool | DType::Uint8 => out.extend(bytes.iter().map(|&b| f64::from(b))),
        DType::Int8 => out.extend(bytes.iter().map(|&b| f64::from(b as i8))),
        DType::Int16 => each!(2, |a| f64::from(i16::from_le_bytes(a))),
        DType::Int32 => each!(4, |a| f64::from(i32::from_le_bytes(a))),
        DType::Int64 => each!(8, |a| i64::from_le_bytes(a) as f64),
        DType::Float16 => each!(2, |a| half::f16::from_le_bytes(a).to_f64()),
        DType::Bfloat16 => each!(2, |a| half::bf16::from_le_bytes(a).to_f64()),
        DType::Float32 => each!(4, |a| f64::from(f32::from_le_bytes(a))),
        DType::Float64 => each!(8, f64::from_le_bytes),
    }
}

/// Elements converted at a time by [`cast`] and its kin: a small buffer of `i64`.
pub(crate) const PIECE: usize = 1024;

/// The elements of `bytes` (whole elements of `from`) written into `out` as elements
/// of `to`, each as `encode_i64(to, read_i64(from, e))` writes it, in tight loops per
/// type: blocks given narrow are widened, and ranged blocks narrowed, this way. `out`
/// holds as many elements as `bytes`; elements past the shorter are left.
pub(crate) fn cast(from: DType, bytes: &[u8], to: DType, out: &mut [u8]) {
    // An integer read and written back is itself (not so a bool or a float).
    if from == to && from.int_range().is_some() {
        let n = bytes.len().min(out.len());
        out[..n].copy_from_slice(&bytes[..n]);
        return;
    }
    let ts = size(to);
    let Ok(()) = by_piece(from, bytes, |first, wide| {
        if let Some(o) = out.get_mut(first * ts..) {
            write_ints(to, wide, o);
        }
        Ok::<(), std::convert::Infallible>(())
    });
}

/// `f` called with each piece of [`PIECE`] elements of `bytes` (whole elements of `d`),
/// read as `i64` in a tight loop per type, and the index of its first element; the
/// first error `f` returns ends the walk and is returned.
pub(crate) fn by_piece<E>(
    d: DType,
    bytes: &[u8],
    mut f: impl FnMut(usize, &mut [i64]) -> Result<(), E>,
) -> Result<(), E> {
    let mut wide = [0i64; PIECE];
    let es = size(d);
    for (p, piece) in bytes.chunks(PIECE * es).enumerate() {
        let wide = &mut wide[..piece.len() / es];
        read_ints(d, piece, wide);
        f(p * PIECE, wide)?;
    }
    Ok(())
}

/// Elements of `d` in `bytes` read as `i64` into `out`, as [`read_i64`] reads each.
pub(crate) fn read_ints(d: DType, bytes: &[u8], out: &mut [i64]) {
    macro_rules! each {
        ($t:ty) => {{
            const N: usize = std::mem::size_of::<$t>();
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(N)) {
                *o = <$t>::from_le_bytes(c.try_into().unwrap_or([0; N])) as i64;
            }
        }};
    }
    match d {
        DType::Bool | DType::Uint8 => each!(u8),
        DType::Int8 => each!(i8),
        DType::Int16 => each!(i16),
        DType::Int32 => each!(i32),
        DType::Int64 => each!(i64),
        _ => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(size(d))) {
                *o = read_i64(d, c);
            }
        }
    }
}

/// The value 1 as one element of `d`, `N` bytes wide (`N` is `d`'s size; zeros if not).
pub(crate) fn one_as<const N: usize>(d: DType) -> [u8; N] {
    let mut one = Vec::with_capacity(N);
    encode_i64(d, 1, &mut one);
    one.try_into().unwrap_or([0; N])
}

/// `values` written into `out` as elements of `d`, as [`encode_i64`] writes each.
pub fn write_ints(d: DType, values: &[i64], out: &mut [u8]) {
    macro_rules! each {
        ($t:ty, $v:ident => $e:expr) => {{
            const N: usize = std::mem::size_of::<$t>();
            for (o, &$v) in out.chunks_exact_mut(N).zip(values) {
                o.copy_from_slice(&($e).to_le_bytes());
            }
        }};
    }
    match d {
        DType::Bool => each!(u8, v => u8::from(v != 0)),
        DType::Uint8 => each!(u8, v => v as u8),
        DType::Int8 => each!(i8, v => v as i8),
        DType::Int16 => each!(i16, v => v as i16),
        DType::Int32 => each!(i32, v => v as i32),
        DType::Int64 => each!(i64, v => v),
        DType::Float32 => each!(f32, v => v as f64 as f32),
        DType::Float64 => each!(f64, v => v as f64),
        DType::Float16 | DType::Bfloat16 => {
            let mut one = Vec::with_capacity(2);
            for (o, &v) in out.chunks_exact_mut(2).zip(values) {
                one.clear();
                encode_i64(d, v, &mut one);
                o.copy_from_slice(&one);
            }
        }
    }
}

/// One element read as `i64` (integers exactly; floats truncated toward zero).
pub(crate) fn read_i64(d: DType, bytes: &[u8]) -> i64 {
    fn le<const N: usize>(bytes: &[u8]) -> [u8; N] {
        bytes
            .get(..N)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0; N])
    }
    // Integers read directly: this runs once per index of every compact block.
    match d {
        DType::Bool | DType::Uint8 => i64::from(bytes.first().copied().unwrap_or(0)),
        DType::Int8 => i64::from(bytes.first().copied().unwrap_or(0) as i8),
        DType::Int16 => i64::from(i16::from_le_bytes(le(bytes))),
        DType::Int32 => i64::from(i32::from_le_bytes(le(bytes))),
        DType::Int64 => i64::from_le_bytes(le(bytes)),
        _ => {
            let mut v = Vec::with_capacity(1);
            decode_into(d, bytes.get(..size(d)).unwrap_or(&[]), &mut v);
            v.first().map_or(0, |&x| x as i64)
        }
    }
}

/// `v` as one element of `d`, appended to `out` (integers wrap as a C cast does; a
/// bool is `v != 0`).
pub fn encode_i64(d: DType, v: i64, out: &mut Vec<u8>) {
    match d {
        DType::Bool => out.push(u8::from(v != 0)),
        DType::Uint8 => out.push(v as u8),
        DType::Int8 => out.push(v as i8 as u8),
        DType::Int16 => out.extend((v as i16).to_le_bytes()),
        DType::Int32 => out.extend((v as i32).to_le_bytes()),
        DType::Int64 => out.extend(v.to_le_bytes()),
        _ => encode_f64(d, v as f64, out),
    }
}

/// `v` as one element of `d`, appended to `out` (floats round to nearest; integers are
/// truncated toward zero, as a C cast does).
pub fn encode_f64(d: DType, v: f64, out: &mut Vec<u8>) {
    match d {
        DType::Float16 => out.extend(half::f16::from_f64(v).to_le_bytes()),
        DType::Bfloat16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
        DType::Float32 => out.extend((v as f32).to_le_bytes()),
        DType::Float64 => out.extend(v.to_le_bytes()),
        DType::Bool => out.push(u8::from(v != 0.0)),
        _ => encode_i64(d, v as i64, out),
    }
}

/// One element holding the pad value.
pub(crate) fn pad_bytes(d: DType, pad: PadValue) -> Vec<u8> {
    let mut out = Vec::with_capacity(size(d));
    match pad {
        PadValue::Bool(b) => encode_i64(d, i64::from(b), &mut out),
        PadValue::Int(i) => encode_i64(d, i, &mut out),
        PadValue::Float(x) => encode_f64(d, x, &mut out),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_small_integers_and_has_its_size() {
        for d in DType::ALL {
            let mut bytes = Vec::new();
            for v in [0i64, 1, 5, 100] {
                encode_i64(d, v, &mut bytes);
            }
            assert_eq!(bytes.len(), 4 * size(d), "{d}");
            let mut back = Vec::new();
            decode_into(d, &bytes, &mut back);
            let want: Vec<f64> = if d == DType::Bool {
                vec![0.0, 1.0, 1.0, 1.0]
            } else {
                vec![0.0, 1.0, 5.0, 100.0]
            };
            assert_eq!(back, want, "{d}");
            assert_eq!(read_i64(d, &bytes[size(d)..]), 1, "{d}");
            assert_eq!(from_safetensors(to_safetensors(d)), Some(d));
        }
    }

    #[test]
    fn cast_writes_each_element_as_encode_i64_does() {
        let values = [0i64, 1, -1, 7, 127, -128, 255, 300, -40_000, 1 << 40];
        for from in DType::ALL {
            let mut bytes = Vec::new();
            values.iter().for_each(|&v| encode_i64(from, v, &mut bytes));
            // Enough elements to span several of `cast`'s pieces.
            let bytes = bytes.repeat(300);
            for to in DType::ALL {
                let mut want = Vec::new();
                for e in bytes.chunks_exact(size(from)) {
                    encode_i64(to, read_i64(from, e), &mut want);
                }
                let mut got = vec![0xAA; want.len()];
                cast(from, &bytes, to, &mut got);
                assert_eq!(got, want, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn pad_values_are_written_in_the_feature_dtype() {
        assert_eq!(
            pad_bytes(DType::Float32, PadValue::Float(-1.0)),
            (-1.0f32).to_le_bytes()
        );
        assert_eq!(
            pad_bytes(DType::Int64, PadValue::Int(-1)),
            (-1i64).to_le_bytes()
        );
        assert_eq!(pad_bytes(DType::Bool, PadValue::Bool(true)), [1]);
        assert_eq!(
            pad_bytes(DType::Int32, PadValue::Int(7)),
            7i32.to_le_bytes()
        );
    }
}
