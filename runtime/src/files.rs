//! Safetensors files of tch tensors, with the header's `__metadata__` (string -> string)
//! that carries values a tensor cannot hold (a featurizer's record, as JSON text).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype, View};
use tch::{Kind, Tensor};

use crate::error::{RuntimeError, TorchContext};

/// Feature name -> tensor.
pub type Tensors = BTreeMap<String, Tensor>;
/// The header's `__metadata__`: name -> text.
pub type Metadata = BTreeMap<String, String>;

fn io(path: &Path, message: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Io {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// Largest safetensors header read (the format's own limit is 100 MB).
const MAX_HEADER_BYTES: u64 = 100 * 1000 * 1000;

/// Every tensor of a safetensors file. The header is checked first against the file's
/// size, so a device, a pipe or a file whose header claims more than it holds is
/// refused before anything large is read.
pub fn read_tensors(path: &Path) -> Result<Tensors, RuntimeError> {
    check_claims(path)?;
    let tensors =
        Tensor::read_safetensors(path).map_err(|e| io(path, format!("cannot read: {e}")))?;
    Ok(tensors.into_iter().collect())
}

/// A safetensors file's header (JSON) and the size of the data after it. Reads the
/// header only, bounded by the file's size: a regular file is required.
fn read_header(path: &Path) -> Result<(serde_json::Value, u64), RuntimeError> {
    use std::io::Read;
    let bad = |e: String| io(path, format!("cannot read: {e}"));
    let mut file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let size = meta.len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|_| bad(format!("{size} bytes is too short for a safetensors file")))?;
    let n = u64::from_le_bytes(len);
    if n > size.saturating_sub(8) || n > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "its header claims {n} bytes, but the file holds {size} (truncated, or not safetensors)"
        )));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header)
        .map_err(|e| bad(e.to_string()))?;
    let value: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(format!("its header is not JSON: {e}")))?;
    Ok((value, size - 8 - n))
}

/// Every tensor's data range must lie inside the file.
fn check_claims(path: &Path) -> Result<(), RuntimeError> {
    let (header, data) = read_header(path)?;
    let Some(entries) = header.as_object() else {
        return Err(io(path, "its header is not a JSON object"));
    };
    for (name, entry) in entries.iter().filter(|(k, _)| *k != "__metadata__") {
        let end = entry["data_offsets"]
            .get(1)
            .and_then(serde_json::Value::as_u64);
        if end.is_none_or(|end| end > data) {
            return Err(io(
                path,
                format!("feature `{name}` claims data past the end of the file ({data} bytes of data; truncated?)"),
            ));
        }
    }
    Ok(())
}

/// The `__metadata__` of a safetensors file's header (empty when it has none).
pub fn read_metadata(path: &Path) -> Result<Metadata, RuntimeError> {
    let (value, _) = read_header(path)?;
    Ok(value
        .get("__metadata__")
        .and_then(|m| m.as_object())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default())
}

/// One tensor's bytes as safetensors stores them (little-endian, row-major).
struct Bytes {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Bytes {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn dtype_of(kind: Kind) -> Option<Dtype> {
    Some(match kind {
        Kind::Bool => Dtype::BOOL,
        Kind::Uint8 => Dtype::U8,
        Kind::Int8 => Dtype::I8,
        Kind::Int16 => Dtype::I16,
        Kind::Int => Dtype::I32,
        Kind::Int64 => Dtype::I64,
        Kind::Half => Dtype::F16,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Float => Dtype::F32,
        Kind::Double => Dtype::F64,
        _ => return None,
    })
}

fn bytes_of(name: &str, t: &Tensor) -> Result<Bytes, RuntimeError> {
    let dtype = dtype_of(t.kind()).ok_or_else(|| RuntimeError::Blocks {
        feature: name.to_owned(),
        message: format!("dtype {:?} cannot be stored in safetensors", t.kind()),
    })?;
    let t = t.contiguous();
    let numel = t.numel();
    let mut data = vec![0u8; numel * t.kind().elt_size_in_bytes()];
    t.f_copy_data_u8(&mut data, numel).feature(name)?;
    Ok(Bytes {
        dtype,
        shape: t.size().iter().map(|&d| d as usize).collect(),
        data,
    })
}

/// The bytes of a safetensors file of these tensors (and `__metadata__`, when any).
pub fn serialize(tensors: &Tensors, metadata: &Metadata) -> Result<Vec<u8>, RuntimeError> {
    let bytes: Vec<(String, Bytes)> = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), bytes_of(n, t)?)))
        .collect::<Result<_, RuntimeError>>()?;
    let info = (!metadata.is_empty()).then(|| metadata.clone().into_iter().collect());
    safetensors::serialize(bytes.iter().map(|(n, b)| (n.as_str(), b)), info).map_err(|e| {
        RuntimeError::Blocks {
            feature: "*".into(),
            message: e.to_string(),
        }
    })
}

/// Writes tensors (and `__metadata__`, when any) to a safetensors file.
pub fn write(path: &Path, tensors: &Tensors, metadata: &Metadata) -> Result<(), RuntimeError> {
    let file = serialize(tensors, metadata)?;
    std::fs::write(path, &file).map_err(|e| io(path, format!("cannot write: {e}")))
}
