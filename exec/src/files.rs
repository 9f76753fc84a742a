//! Safetensors files as raw bytes: the header read and checked against the file before
//! anything is mapped, every tensor a view of the memory map, and the header of a file
//! written in parts (header first, then each tensor's data in the format's order).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use featshard_spec::ir::DType;

use crate::array::Array;
use crate::dtype;
use crate::error::ExecError;
use crate::mapping::Mapping;

/// Files this process may hold mapped at once (every [`Mapped`] is one while it lives):
/// work that maps a file each, such as a dataset's jobs, runs at most this many at once.
pub const MAX_MAPPED: usize = crate::mapping::SLOTS;

/// The header's `__metadata__`: name -> text.
pub type Metadata = BTreeMap<String, String>;
/// Feature name -> array.
pub type Sample<'a> = BTreeMap<String, Array<'a>>;

/// Largest safetensors header read (the format's own limit is 100 MB).
const MAX_HEADER_BYTES: u64 = 100 * 1000 * 1000;

fn io(path: &Path, message: impl std::fmt::Display) -> ExecError {
    ExecError::Io {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// One tensor's entry in a safetensors header.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The tensor's name.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its byte range in the data section.
    pub offsets: (u64, u64),
}

/// A checked safetensors header.
#[derive(Clone, Debug)]
pub struct Header {
    /// Every tensor, sorted by name.
    pub entries: Vec<Entry>,
    /// The `__metadata__` (empty when there is none).
    pub metadata: Metadata,
    /// Where the data section starts in the file.
    pub data_start: u64,
}

impl Header {
    /// Where the data section ends: the file's bytes a reader needs.
    pub fn data_end(&self) -> u64 {
        let data = self.entries.iter().map(|e| e.offsets.1).max().unwrap_or(0);
        self.data_start + data
    }
}

/// Reads `window` (`(start, stop)` per axis) of tensor `entry` of the safetensors
/// file `file` (whose data section starts at `data_start`) into `out`, the window's
/// bytes row-major: one positioned read per run contiguous in the file, nothing else of
/// the tensor read. A window off the tensor, or an `out` of another size, is refused.
pub fn read_window(
    (file, path): (&std::fs::File, &Path),
    data_start: u64,
    entry: &Entry,
    window: &[(usize, usize)],
    out: &mut [u8],
) -> Result<(), ExecError> {
    use std::os::unix::fs::FileExt;
    let shape = &entry.shape;
    let fits = window.len() == shape.len()
        && window
            .iter()
            .zip(shape)
            .all(|(&(a, b), &n)| a <= b && b <= n);
    let es = dtype::size(entry.dtype);
    let lens: Vec<usize> = window.iter().map(|&(a, b)| b - a).collect();
    if !fits || out.len() != lens.iter().product::<usize>() * es {
        let message = format!(
            "tensor `{}` of shape {shape:?}: no window {window:?} into {} bytes",
            entry.name,
            out.len()
        );
        return Err(io(path, message));
    }
    // The run: the trailing axes the window covers whole, and the one before them.
    let mut k = shape.len();
    let mut run = 1;
    while k > 0 {
        k -= 1;
        run *= lens[k];
        if lens[k] != shape[k] {
            break;
        }
    }
    let strides = featshard_spec::layout::contiguous_stride(shape);
    let base = data_start + entry.offsets.0;
    let at_of = |outer: &[usize]| {
        let head: usize = outer
            .iter()
            .zip(window)
            .zip(&strides)
            .map(|((&i, w), s)| (w.0 + i) * s)
            .sum();
        let tail: usize = window[outer.len()..]
            .iter()
            .zip(&strides[outer.len()..])
            .map(|(w, s)| w.0 * s)
            .sum();
        base + ((head + tail) * es) as u64
    };
    if run == 0 {
        return Ok(());
    }
    for (i, chunk) in out.chunks_mut(run * es).enumerate() {
        let outer = featshard_spec::layout::unravel(i, &lens[..k]);
        file.read_exact_at(chunk, at_of(&outer))
            .map_err(|e| io(path, format!("tensor `{}`: cannot read: {e}", entry.name)))?;
    }
    Ok(())
}

/// A safetensors file's header, read alone and bounded by the file's size (a regular
/// file is required): every tensor's dtype, shape and data range checked.
pub fn read_header(path: &Path) -> Result<Header, ExecError> {
    header_of(header_json(path)?, path)
}

fn header_of(
    (value, data, start): (serde_json::Value, u64, u64),
    path: &Path,
) -> Result<Header, ExecError> {
    let Some(object) = value.as_object() else {
        return Err(io(path, "its header is not a JSON object"));
    };
    let mut entries = Vec::with_capacity(object.len());
    let mut metadata = Metadata::new();
    for (name, entry) in object {
        if name == "__metadata__" {
            if let Some(m) = entry.as_object() {
                metadata = m
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect();
            }
            continue;
        }
        entries.push(parse_entry(path, name, entry, data)?);
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Header {
        entries,
        metadata,
        data_start: start,
    })
}

/// The `__metadata__` of a safetensors file's header (empty when it has none).
pub fn read_metadata(path: &Path) -> Result<Metadata, ExecError> {
    let (value, _, _) = header_json(path)?;
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

/// Opens `path` for reading without blocking on a FIFO or a device (the type is
/// checked before any read): a regular file is required.
pub fn open_regular(path: &Path) -> Result<std::fs::File, ExecError> {
    use std::os::unix::fs::OpenOptionsExt;
    let bad = |e: String| io(path, format!("cannot read: {e}"));
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| bad(e.to_string()))?;
    let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    Ok(file)
}

/// A regular file's bytes, at most `limit` of them: more is an error naming the file
/// (an endless or huge file is refused, not read until memory ends).
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, ExecError> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| io(path, format!("cannot read: {e}")))?;
    if bytes.len() as u64 > limit {
        return Err(io(path, format!("more than {limit} bytes")));
    }
    Ok(bytes)
}

/// The header as JSON, the size of the data after it, and where the data starts.
fn header_json(path: &Path) -> Result<(serde_json::Value, u64, u64), ExecError> {
    header_json_of(&mut open_regular(path)?, path)
}

/// [`header_json`] of a file opened by [`open_regular`].
fn header_json_of(
    file: &mut std::fs::File,
    path: &Path,
) -> Result<(serde_json::Value, u64, u64), ExecError> {
    let bad = |e: String| io(path, format!("cannot read: {e}"));
    let size = file.metadata().map_err(|e| bad(e.to_string()))?.len();
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
    Ok((value, size - 8 - n, 8 + n))
}

fn parse_entry(
    path: &Path,
    name: &str,
    entry: &serde_json::Value,
    data: u64,
) -> Result<Entry, ExecError> {
    let bad = |what: String| io(path, format!("feature `{name}`: {what}"));
    let name_of = entry["dtype"].as_str().unwrap_or("?");
    let dtype = serde_json::from_value::<safetensors::Dtype>(entry["dtype"].clone())
        .ok()
        .and_then(dtype::from_safetensors)
        .ok_or_else(|| bad(format!("dtype {name_of} is not supported")))?;
    let shape: Option<Vec<usize>> = entry["shape"].as_array().and_then(|a| {
        a.iter()
            .map(|d| {
                d.as_u64()
                    .and_then(|d| i64::try_from(d).ok())
                    .map(|d| d as usize)
            })
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
    let want = numel.and_then(|n| n.checked_mul(dtype::size(dtype) as u64));
    if want != Some(b - a) {
        return Err(bad(format!(
            "shape {shape:?} of {name_of} does not hold {} bytes",
            b - a
        )));
    }
    Ok(Entry {
        name: name.to_owned(),
        dtype,
        shape,
        offsets: (a, b),
    })
}

/// A safetensors file mapped whole, its header checked.
#[derive(Debug)]
pub struct Mapped {
    mapping: Mapping,
    header: Header,
}

impl Mapped {
    /// Checks the header of `path`, then maps the file.
    pub fn open(path: &Path) -> Result<Mapped, ExecError> {
        let mut file = open_regular(path)?;
        let header = header_of(header_json_of(&mut file, path)?, path)?;
        let mapping = Mapping::open(file).map_err(|e| io(path, format!("cannot map: {e}")))?;
        // What featshard accepts, the ecosystem reads: safetensors' own validation too
        // (data contiguous, in order, no overlap, nothing past the end).
        safetensors::SafeTensors::read_metadata(mapping.bytes())
            .map_err(|e| io(path, format!("safetensors refuses its header: {e:?}")))?;
        if (mapping.bytes().len() as u64) < header.data_end() {
            return Err(io(path, "the file shrank while it was opened"));
        }
        Ok(Mapped { mapping, header })
    }

    /// `Err` naming `path` when the file was truncated or written while mapped (see
    /// [`Mapping::check_unchanged`]); writers call it before they put an output in place.
    pub fn check_unchanged(&self, path: &Path) -> Result<(), ExecError> {
        self.mapping
            .check_unchanged()
            .map_err(|why| io(path, format!("{why}; nothing was written from it")))
    }

    /// The file's size and modification time (seconds, nanoseconds) when opened.
    pub fn opened(&self) -> (u64, (i64, i64)) {
        self.mapping.opened()
    }

    /// The whole file's bytes (header and data), as mapped.
    pub fn bytes(&self) -> &[u8] {
        self.mapping.bytes()
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Every tensor, a view of the mapping that gives its pages back once read.
    pub fn sample(&self) -> Sample<'_> {
        let bytes = self.mapping.bytes();
        let pages = self.mapping.pages();
        self.header
            .entries
            .iter()
            .map(|e| {
                let (a, b) = (
                    (self.header.data_start + e.offsets.0) as usize,
                    (self.header.data_start + e.offsets.1) as usize,
                );
                let x = Array::borrowed(e.dtype, e.shape.clone(), &bytes[a..b], Some(pages));
                (e.name.clone(), x)
            })
            .collect()
    }
}

/// The order safetensors lays tensors out in (largest dtype first, then by name), as
/// indices into `entries` (name, dtype, shape).
pub fn data_order(entries: &[(&str, DType, Vec<usize>)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (
            dtype::to_safetensors(entries[a].1),
            dtype::to_safetensors(entries[b].1),
        );
        y.cmp(&x).then(entries[a].0.cmp(entries[b].0))
    });
    order
}

/// The first bytes of a safetensors file whose tensors (name, dtype, shape) follow in
/// this order: the header's length, then the header, padded to 8 bytes as safetensors
/// pads it; byte for byte what `safetensors::serialize` writes before the data.
pub fn header(
    entries: &[(&str, DType, Vec<usize>)],
    metadata: &Metadata,
) -> Result<Vec<u8>, ExecError> {
    use safetensors::tensor::{Metadata as Layout, TensorInfo};
    let bad = |message: String| ExecError::Safetensors { message };
    let mut offset = 0;
    let mut infos = Vec::with_capacity(entries.len());
    for (name, d, shape) in entries {
        let n = shape.iter().product::<usize>() * dtype::size(*d);
        infos.push((
            (*name).to_owned(),
            TensorInfo {
                dtype: dtype::to_safetensors(*d),
                shape: shape.clone(),
                data_offsets: (offset, offset + n),
            },
        ));
        offset += n;
    }
    let info = (!metadata.is_empty()).then(|| metadata.clone().into_iter().collect());
    let layout = Layout::new(info, infos).map_err(|e| bad(e.to_string()))?;
    let mut json = serde_json::to_vec(&layout).map_err(|e| bad(e.to_string()))?;
    json.resize(json.len().next_multiple_of(8), b' ');
    if json.len() as u64 > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "a header of {} bytes (names, shapes and metadata) is past safetensors' limit of {MAX_HEADER_BYTES}: no reader could open the file",
            json.len()
        )));
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    Ok(out)
}

/// A whole safetensors file of `tensors` (name, dtype, shape, row-major bytes) with
/// `metadata`: byte for byte what `safetensors::serialize` writes.
pub fn serialize(
    tensors: &[(&str, DType, Vec<usize>, &[u8])],
    metadata: &Metadata,
) -> Result<Vec<u8>, ExecError> {
    let keyed: Vec<(&str, DType, Vec<usize>)> = tensors
        .iter()
        .map(|(n, d, s, _)| (*n, *d, s.clone()))
        .collect();
    let order = data_order(&keyed);
    let mut in_order: Vec<(&str, DType, Vec<usize>)> = Vec::with_capacity(order.len());
    let mut data = 0;
    for &i in &order {
        in_order.push(keyed[i].clone());
        data += tensors[i].3.len();
    }
    let mut out = header(&in_order, metadata)?;
    out.reserve(data);
    for &i in &order {
        out.extend_from_slice(tensors[i].3);
    }
    Ok(out)
}

/// A file's size and CRC-32 taken as its bytes go by: the one way featshard sums a
/// file, as it is written, read back or verified.
#[derive(Default)]
pub(crate) struct Summing {
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl Summing {
    pub(crate) fn update(&mut self, data: &[u8]) {
        self.crc.update(data);
        self.bytes += data.len() as u64;
    }

    pub(crate) fn finish(self) -> featshard_spec::shards::FileSum {
        featshard_spec::shards::FileSum {
            bytes: self.bytes,
            crc32: self.crc.finalize(),
        }
    }
}

/// A file's size and CRC-32, read in pieces (a finished sample being verified); a
/// regular file only.
pub fn sum_of_file(path: &Path) -> std::io::Result<featshard_spec::shards::FileSum> {
    let mut f = open_regular(path).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut sum = Summing::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sum.update(&buf[..n]);
    }
    Ok(sum.finish())
}

/// The size and CRC-32 of a file's bytes (a mapped rank file, checked against its
/// manifest before it is used).
pub(crate) fn sum_of(bytes: &[u8]) -> featshard_spec::shards::FileSum {
    let mut sum = Summing::default();
    sum.update(bytes);
    sum.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_window_of_a_tensor_reads_its_elements_row_major() {
        let shape = [3usize, 4, 2];
        let values: Vec<u8> = (0..24u16).flat_map(|v| (v * 7).to_le_bytes()).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::I16, shape.to_vec(), &values)
                .unwrap();
        safetensors::serialize_to_file([("x", view)], None, &path).unwrap();
        let header = read_header(&path).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let ranges = |n: usize| (0..=n).flat_map(move |a| (a..=n).map(move |b| (a, b)));
        let mut read = 0;
        for w0 in ranges(3) {
            for w1 in ranges(4) {
                for w2 in ranges(2) {
                    let window = [w0, w1, w2];
                    let mut want = Vec::new();
                    for i in w0.0..w0.1 {
                        for j in w1.0..w1.1 {
                            for k in w2.0..w2.1 {
                                let at = (i * 4 + j) * 2 + k;
                                want.extend_from_slice(&values[at * 2..at * 2 + 2]);
                            }
                        }
                    }
                    let mut out = vec![0xEEu8; want.len()];
                    let entry = &header.entries[0];
                    read_window((&file, &path), header.data_start, entry, &window, &mut out)
                        .unwrap();
                    assert_eq!(out, want, "{window:?}");
                    read += 1;
                }
            }
        }
        assert_eq!(read, 10 * 15 * 6);
        let mut out = vec![0u8; 4];
        let e = read_window(
            (&file, &path),
            header.data_start,
            &header.entries[0],
            &[(0, 1), (0, 1), (1, 3)],
            &mut out,
        );
        assert!(
            e.unwrap_err().to_string().contains("no window"),
            "a window off the tensor"
        );
    }
}
