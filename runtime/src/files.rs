//! Safetensors files of tch tensors, with the header's `__metadata__` (string -> string)
//! that carries values a tensor cannot hold (a featurizer's record, as JSON text).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype, View};
use tch::{Device, Kind, Tensor};

use featshard_exec::files::Entry;

use crate::error::{RuntimeError, TorchContext};
use crate::kind::kind_of;
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

/// Every tensor of a safetensors file, memory-mapped (copy-on-write, the file opened
/// read-only): nothing is read until it is used, and writing into a tensor leaves the
/// file as it is. A file changed or truncated while mapped is undefined, as for any
/// memory map (safetensors' own `load_file` maps files the same way). The header is
/// checked first against the file's size (by the byte executor's reader, the one both
/// executors use), so a device, a pipe or a file whose header claims more than it holds
/// is refused before anything large is read.
pub fn read_tensors(path: &Path) -> Result<Tensors, RuntimeError> {
    let header = featshard_exec::files::read_header(path)?;
    let Some(file) = path.to_str() else {
        // libtorch maps files by UTF-8 name; any other name is read into memory.
        let tensors =
            Tensor::read_safetensors(path).map_err(|e| io(path, format!("cannot read: {e}")))?;
        return Ok(tensors.into_iter().collect());
    };
    let mapping =
        Mapping::open(file, header.data_end()).map_err(|e| io(path, format!("cannot map: {e}")))?;
    header
        .entries
        .iter()
        .map(|e| {
            let t = view(&mapping, header.data_start, e)
                .map_err(|err| io(path, format!("feature `{}`: cannot map: {err}", e.name)))?;
            Ok((e.name.clone(), t))
        })
        .collect()
}

/// One tensor of a checked header as a view of the file's mapping.
fn view(mapping: &Mapping, data_start: u64, e: &Entry) -> Result<Tensor, tch::TchError> {
    let kind = kind_of(e.dtype);
    let (a, b) = (data_start + e.offsets.0, data_start + e.offsets.1);
    let mut raw = mapping.bytes(a, b - a)?;
    if a % kind.elt_size_in_bytes() as u64 != 0 {
        // A misaligned tensor (not written by safetensors itself) is copied.
        let mut copy = Tensor::f_empty([(b - a) as i64], (Kind::Uint8, Device::Cpu))?;
        copy.f_copy_(&raw)?;
        raw = copy;
    }
    let shape: Vec<i64> = e.shape.iter().map(|&d| d as i64).collect();
    raw.f_view_dtype(kind)?.f_view(shape.as_slice())
}

/// The `__metadata__` of a safetensors file's header (empty when it has none).
pub use featshard_exec::files::read_metadata;

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
    crate::kind::dtype_of(kind).map(featshard_exec::dtype::to_safetensors)
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
    let t = crate::views::resolved(t).feature(name)?.contiguous();
    let numel = t.numel();
    let mut data = vec![0u8; numel * t.kind().elt_size_in_bytes()];
    t.f_copy_data_u8(&mut data, numel).feature(name)?;
    Ok(data)
}

/// The bytes of a safetensors file of these tensors (and `__metadata__`, when any).
pub fn serialize(tensors: &Tensors, metadata: &Metadata) -> Result<Vec<u8>, RuntimeError> {
    let bytes: Vec<(String, Bytes)> = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), bytes_of(n, t)?)))
        .collect::<Result<_, RuntimeError>>()?;
    let info = (!metadata.is_empty()).then(|| metadata.clone().into_iter().collect());
    safetensors::serialize(bytes.iter().map(|(n, b)| (n.as_str(), b)), info).map_err(|e| {
        RuntimeError::Safetensors {
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
        use featshard_exec::files::{data_order, header};
        use featshard_spec::ir::DType;
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
        let entries: Vec<(&str, DType, Vec<usize>)> = tensors
            .iter()
            .map(|(n, t)| {
                let d = crate::kind::dtype_of(t.kind()).unwrap();
                (
                    n.as_str(),
                    d,
                    t.size().iter().map(|&d| d as usize).collect(),
                )
            })
            .collect();
        let order = data_order(&entries);
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
