//! Spec dtypes as tch kinds, and pad values as scalars.

use featshard_spec::ir::{DType, PadValue};
use tch::{Kind, Scalar};

/// The tch kind of a spec dtype.
pub fn kind_of(d: DType) -> Kind {
    match d {
        DType::Bool => Kind::Bool,
        DType::Uint8 => Kind::Uint8,
        DType::Int8 => Kind::Int8,
        DType::Int16 => Kind::Int16,
        DType::Int32 => Kind::Int,
        DType::Int64 => Kind::Int64,
        DType::Float16 => Kind::Half,
        DType::Bfloat16 => Kind::BFloat16,
        DType::Float32 => Kind::Float,
        DType::Float64 => Kind::Double,
    }
}

/// The spec dtype of a tch kind, if a spec can declare it.
pub fn dtype_of(k: Kind) -> Option<DType> {
    DType::ALL.into_iter().find(|d| kind_of(*d) == k)
}

/// The spec's name of a tch kind, for messages.
pub fn kind_name(k: Kind) -> String {
    dtype_of(k)
        .map(|d| d.name().to_owned())
        .unwrap_or_else(|| format!("{k:?}"))
}

/// A pad value as a tch scalar.
pub fn scalar(p: PadValue) -> Scalar {
    match p {
        PadValue::Bool(b) => Scalar::int(i64::from(b)),
        PadValue::Int(i) => Scalar::int(i),
        PadValue::Float(x) => Scalar::float(x),
    }
}
