//! Safetensors files of tch tensors, with the header's `__metadata__` (string -> string)
//! that carries values a tensor cannot hold (a featurizer's record, as JSON text).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype, View};
use tch::{Device, Kind, Tensor};

use crate::error::{RuntimeError, TorchContext};
use crate::mapping::Mapping;

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

/// Every tensor of a safetensors file, memory-mapped (copy-on-write, the file opened
/// read-only): nothing is read until it is used, and writing into a tensor leaves the
/// file as it is. A file changed or truncated while mapped is undefined, as for any
/// memory map (safetensors' own `load_file` maps files the same way). The
/// header is checked first against the file's size, so a device, a pipe or a file whose
/// header claims more than it holds is refused before anything large is read.
pub fn read_tensors(path: &Path) -> Result<Tensors, RuntimeError> {
    map_tensors(path).map(|(tensors, _)| tensors)
}

/// [`read_tensors`], with the file's mapping (`None` for a name libtorch cannot map,
/// read into memory instead).
fn map_tensors(path: &Path) -> Result<(Tensors, Option<Mapping>), RuntimeError> {
    let (header, data) = read_header(path)?;
    let Some(entries) = header.as_object() else {
        return Err(io(path, "its header is not a JSON object"));
    };
    let Some(file) = path.to_str() else {
        // libtorch maps files by UTF-8 name; any other name is read into memory.
        check_claims(path)?;
        let tensors =
            Tensor::read_safetensors(path).map_err(|e| io(path, format!("cannot read: {e}")))?;
        return Ok((tensors.into_iter().collect(), None));
    };
    let start = header_end(path)?;
    let mapping =
        Mapping::open(file, start + data).map_err(|e| io(path, format!("cannot map: {e}")))?;
    let tensors = entries
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(name, entry)| {
            let entry = Entry::parse(path, name, entry, data)?;
            let t = entry
                .view(&mapping, start)
                .map_err(|e| io(path, format!("feature `{name}`: cannot map: {e}")))?;
            Ok((name.clone(), t))
        })
        .collect::<Result<_, RuntimeError>>()?;
    Ok((tensors, Some(mapping)))
}

/// One tensor's entry in a safetensors header.
struct Entry {
    kind: Kind,
    shape: Vec<i64>,
    /// Byte range in the data section.
    offsets: (u64, u64),
}

impl Entry {
    fn parse(
        path: &Path,
        name: &str,
        entry: &serde_json::Value,
        data: u64,
    ) -> Result<Entry, RuntimeError> {
        let bad = |what: String| io(path, format!("feature `{name}`: {what}"));
        let dtype = entry["dtype"].as_str().unwrap_or("?");
        let kind = kind_of(dtype).ok_or_else(|| bad(format!("dtype {dtype} is not supported")))?;
        let shape: Option<Vec<i64>> = entry["shape"].as_array().and_then(|a| {
            a.iter()
                .map(|d| d.as_u64().and_then(|d| i64::try_from(d).ok()))
                .collect()
        });
        let shape = shape.ok_or_else(|| bad("its shape is not a list of sizes".into()))?;
        let offsets = match entry["data_offsets"].as_array().map(Vec::as_slice) {
            Some([a, b]) => a.as_u64().zip(b.as_u64()),
            _ => None,
        };
        let (a, b) = offsets
            .filter(|(a, b)| a <= b && *b <= data)
            .ok_or_else(|| {
                bad(format!(
                    "claims data past the end of the file ({data} bytes of data; truncated?)"
                ))
            })?;
        let numel = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
        let want = numel.and_then(|n| n.checked_mul(kind.elt_size_in_bytes() as u64));
        if want != Some(b - a) {
            return Err(bad(format!(
                "shape {shape:?} of {dtype} does not hold {} bytes",
                b - a
            )));
        }
        Ok(Entry {
            kind,
            shape,
            offsets: (a, b),
        })
    }

    /// The tensor as a view of the file's mapping.
    fn view(&self, mapping: &Mapping, data_start: u64) -> Result<Tensor, tch::TchError> {
        let (a, b) = (data_start + self.offsets.0, data_start + self.offsets.1);
        let mut raw = mapping.bytes(a, b - a)?;
        if a % self.kind.elt_size_in_bytes() as u64 != 0 {
            // A misaligned tensor (not written by safetensors itself) is copied.
            let mut copy = Tensor::f_empty([(b - a) as i64], (Kind::Uint8, Device::Cpu))?;
            copy.f_copy_(&raw)?;
            raw = copy;
        }
        raw.f_view_dtype(self.kind)?.f_view(self.shape.as_slice())
    }
}

fn kind_of(dtype: &str) -> Option<Kind> {
    Some(match dtype {
        "BOOL" => Kind::Bool,
        "U8" => Kind::Uint8,
        "I8" => Kind::Int8,
        "I16" => Kind::Int16,
        "I32" => Kind::Int,
        "I64" => Kind::Int64,
        "F16" => Kind::Half,
        "BF16" => Kind::BFloat16,
        "F32" => Kind::Float,
        "F64" => Kind::Double,
        _ => return None,
    })
}

/// Where the data section of a (checked) safetensors file starts.
fn header_end(path: &Path) -> Result<u64, RuntimeError> {
    use std::io::Read;
    let mut len = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut len))
        .map_err(|e| io(path, format!("cannot read: {e}")))?;
    Ok(8 + u64::from_le_bytes(len))
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
    let dtype = dtype_of(t.kind()).ok_or_else(|| unstorable(name, t.kind()))?;
    Ok(Bytes {
        dtype,
        shape: t.size().iter().map(|&d| d as usize).collect(),
        data: tensor_bytes(name, t)?,
    })
}

fn unstorable(name: &str, kind: Kind) -> RuntimeError {
    RuntimeError::Blocks {
        feature: name.to_owned(),
        message: format!("dtype {kind:?} cannot be stored in safetensors"),
    }
}

/// A tensor's bytes as safetensors stores them (row-major).
pub fn tensor_bytes(name: &str, t: &Tensor) -> Result<Vec<u8>, RuntimeError> {
    let t = t.contiguous();
    let numel = t.numel();
    let mut data = vec![0u8; numel * t.kind().elt_size_in_bytes()];
    t.f_copy_data_u8(&mut data, numel).feature(name)?;
    Ok(data)
}

/// The order safetensors lays tensors out in (largest dtype first, then by name), as
/// indices into `entries` (name, dtype, shape).
pub fn data_order(entries: &[(&str, Kind, Vec<usize>)]) -> Result<Vec<usize>, RuntimeError> {
    let dtypes = entries
        .iter()
        .map(|(n, k, _)| dtype_of(*k).ok_or_else(|| unstorable(n, *k)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| {
        dtypes[b]
            .cmp(&dtypes[a])
            .then(entries[a].0.cmp(entries[b].0))
    });
    Ok(order)
}

/// The first bytes of a safetensors file whose tensors (name, dtype, shape) follow in
/// this order: the header's length, then the header, padded to 8 bytes as safetensors
/// pads it. Byte for byte what [`serialize`] writes before the data.
pub fn header(
    entries: &[(&str, Kind, Vec<usize>)],
    metadata: &Metadata,
) -> Result<Vec<u8>, RuntimeError> {
    use safetensors::tensor::{Metadata as Header, TensorInfo};
    let bad = |e: String| RuntimeError::Blocks {
        feature: "*".into(),
        message: e,
    };
    let mut offset = 0;
    let mut infos = Vec::with_capacity(entries.len());
    for (name, kind, shape) in entries {
        let dtype = dtype_of(*kind).ok_or_else(|| unstorable(name, *kind))?;
        let n = shape.iter().product::<usize>() * kind.elt_size_in_bytes();
        infos.push((
            (*name).to_owned(),
            TensorInfo {
                dtype,
                shape: shape.clone(),
                data_offsets: (offset, offset + n),
            },
        ));
        offset += n;
    }
    let info = (!metadata.is_empty()).then(|| metadata.clone().into_iter().collect());
    let header = Header::new(info, infos).map_err(|e| bad(e.to_string()))?;
    let mut json = serde_json::to_vec(&header).map_err(|e| bad(e.to_string()))?;
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_then_the_data_in_its_order_is_what_serialize_writes() {
        let tensors: Tensors = [
            ("b_mask", Tensor::from_slice(&[true, false, true])),
            ("a_ids", Tensor::from_slice(&[3i64, 1, 4, 1]).view([2, 2])),
            ("c_pos", Tensor::from_slice(&[0.5f32, 1.5])),
            ("d_empty", Tensor::from_slice::<f32>(&[]).view([0, 3])),
        ]
        .into_iter()
        .map(|(n, t)| (n.to_owned(), t))
        .collect();
        let meta: Metadata = [("featshard.rank".to_owned(), "{\"rank\":1}".to_owned())].into();
        let entries: Vec<(&str, Kind, Vec<usize>)> = tensors
            .iter()
            .map(|(n, t)| {
                (
                    n.as_str(),
                    t.kind(),
                    t.size().iter().map(|&d| d as usize).collect(),
                )
            })
            .collect();
        let order = data_order(&entries).unwrap();
        let ordered: Vec<_> = order.iter().map(|&i| entries[i].clone()).collect();
        let mut ours = header(&ordered, &meta).unwrap();
        for (name, _, _) in &ordered {
            ours.extend(tensor_bytes(name, &tensors[*name]).unwrap());
        }
        assert_eq!(ours, serialize(&tensors, &meta).unwrap());
    }

    #[test]
    fn a_mapped_file_reads_back_every_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.safetensors");
        let x = Tensor::from_slice(&[1i32, 2, 3, 4, 5, 6]).view([3, 2]);
        let y = Tensor::from_slice(&[true, false]);
        let tensors: Tensors = [
            ("x".to_owned(), x.shallow_clone()),
            ("y".to_owned(), y.shallow_clone()),
        ]
        .into();
        write(&path, &tensors, &Metadata::new()).unwrap();
        let back = read_tensors(&path).unwrap();
        assert!(back["x"].equal(&x) && back["y"].equal(&y));
        assert_eq!(back["x"].kind(), Kind::Int);
    }
}
