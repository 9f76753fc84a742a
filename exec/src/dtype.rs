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

/// One element read as `i64` (integers exactly; floats truncated toward zero).
pub fn read_i64(d: DType, bytes: &[u8]) -> i64 {
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
pub fn pad_bytes(d: DType, pad: PadValue) -> Vec<u8> {
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
