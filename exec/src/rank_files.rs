//! Every rank's safetensors file of a placed sample, written straight from the input's
//! memory map: header first, then each block in the format's data order, its base runs
//! copied and its pad regions filled as it goes. No padded tensor and no block in
//! memory; the input's pages are given back as they are read, so peak memory stays a
//! few megabytes per writing thread whatever the sample's size.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use featshard_spec::ir::DType;
use featshard_spec::plan::{Plan, Remap};
pub use featshard_spec::shards::FileSum;

use crate::array::Array;
use crate::dtype;
use crate::error::RuntimeError;
use crate::files::{self, Metadata};
use crate::place::{axis_maps, AxisMap, Placed};
use crate::validate::tensor_plan;
use crate::window::{write_window, Sink};

pub use featshard_spec::layout::coords;

/// Writes `paths[r]` (created new) for every rank `r`, with `headers[r]` as its
/// `__metadata__`; `threads` (at least 1) share the ranks. Returns each file's sum.
pub fn write_rank_files(
    plan: &Plan,
    placed: &Placed,
    headers: &[Metadata],
    paths: &[PathBuf],
    threads: usize,
) -> Result<Vec<FileSum>, RuntimeError> {
    let world = placed.layout.mesh.iter().product::<usize>();
    if headers.len() != world || paths.len() != world {
        return Err(RuntimeError::Blocks {
            feature: "*".into(),
            message: format!(
                "{} headers and {} paths for {world} ranks",
                headers.len(),
                paths.len()
            ),
        });
    }
    let entries = entries(plan, placed)?;
    let threads = threads.clamp(1, world.max(1));
    let write = |rank: usize| {
        let file = RankFile {
            plan,
            placed,
            entries: &entries,
            coord: coords(placed.layout.mesh, rank),
        };
        file.write(&paths[rank], &headers[rank])
    };
    let done: Vec<Result<FileSum, RuntimeError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|k| {
                let write = &write;
                scope.spawn(move || {
                    (k..world)
                        .step_by(threads)
                        .map(|r| (r, write(r)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<(usize, Result<FileSum, RuntimeError>)> = workers
            .into_iter()
            // A panic while writing is a bug, not an input error: it propagates.
            .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        all.sort_by_key(|(r, _)| *r);
        all.into_iter().map(|(_, s)| s).collect()
    });
    done.into_iter().collect()
}

/// One entry of a rank file.
struct Entry<'p, 'a> {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    x: &'p Array<'a>,
    /// `None` for a feature carried along whole.
    axes: Option<Vec<AxisMap<'p>>>,
    pad: Vec<u8>,
}

/// Every rank file's entries, in the order safetensors lays out their data.
fn entries<'p, 'a>(
    plan: &Plan,
    placed: &'p Placed<'a>,
) -> Result<Vec<Entry<'p, 'a>>, RuntimeError> {
    let mut out = Vec::new();
    for (name, x) in &placed.arrays {
        let t = tensor_plan(plan, name)?;
        let shapes = placed
            .shapes
            .get(name)
            .ok_or_else(|| RuntimeError::Missing {
                feature: name.clone(),
            })?;
        out.push(Entry {
            name: name.clone(),
            dtype: x.dtype(),
            shape: shapes.local_shape.clone(),
            x,
            axes: Some(axis_maps(t, shapes, &placed.layout)),
            pad: dtype::pad_bytes(x.dtype(), t.pad_value),
        });
    }
    for (name, x) in &placed.passthrough {
        out.push(Entry {
            name: name.clone(),
            dtype: x.dtype(),
            shape: x.shape(),
            x,
            axes: None,
            pad: Vec::new(),
        });
    }
    let keyed: Vec<(&str, DType, Vec<usize>)> = out
        .iter()
        .map(|e| (e.name.as_str(), e.dtype, e.shape.clone()))
        .collect();
    let order = files::data_order(&keyed);
    let mut slots: Vec<Option<Entry>> = out.into_iter().map(Some).collect();
    Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
}

/// One rank's file.
struct RankFile<'r, 'p, 'a> {
    plan: &'r Plan,
    placed: &'p Placed<'a>,
    entries: &'r [Entry<'p, 'a>],
    coord: [usize; 2],
}

impl RankFile<'_, '_, '_> {
    fn write(&self, path: &Path, header: &Metadata) -> Result<FileSum, RuntimeError> {
        let keyed: Vec<(&str, DType, Vec<usize>)> = self
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.dtype, e.shape.clone()))
            .collect();
        let mut out = Out::create(path)?;
        out.copy(&files::header(&keyed, header)?)
            .map_err(|e| write_error(path, e))?;
        for e in self.entries {
            self.write_entry(e, &mut out)
                .map_err(|err| write_error(path, err))?;
        }
        out.finish()
    }

    fn write_entry(&self, e: &Entry, out: &mut Out) -> io::Result<()> {
        let Some(axes) = &e.axes else {
            let whole: Vec<AxisMap> = e
                .shape
                .iter()
                .map(|&padded| AxisMap {
                    padded,
                    positions: None,
                })
                .collect();
            let window: Vec<(usize, usize)> = e.shape.iter().map(|&n| (0, n)).collect();
            return write_window(e.x, &e.pad, &whole, &window, out);
        };
        let t = tensor_plan(self.plan, &e.name).map_err(io::Error::other)?;
        let window = t.block_window(&e.shape, self.coord);
        match &t.remap {
            Remap::ShardLocal { of, mesh_axis } => {
                let layout = &self.placed.layout;
                let start = layout.shard_start(of, *mesh_axis, self.coord).unwrap_or(0) as i64;
                let mut shifted = Shift {
                    out,
                    dtype: e.dtype,
                    by: start,
                    buf: Vec::new(),
                };
                write_window(e.x, &e.pad, axes, &window, &mut shifted)
            }
            _ => write_window(e.x, &e.pad, axes, &window, out),
        }
    }
}

/// Shard-local ids: every real entry (each copied one; pads are filled) moved by the
/// start of its shard.
struct Shift<'o> {
    out: &'o mut Out,
    dtype: DType,
    by: i64,
    buf: Vec<u8>,
}

impl Sink for Shift<'_> {
    fn copy(&mut self, bytes: &[u8]) -> io::Result<()> {
        let es = dtype::size(self.dtype);
        self.buf.clear();
        for v in bytes.chunks_exact(es) {
            dtype::encode_i64(
                self.dtype,
                dtype::read_i64(self.dtype, v) - self.by,
                &mut self.buf,
            );
        }
        self.out.copy(&self.buf)
    }

    fn fill(&mut self, pad: &[u8], count: usize) -> io::Result<()> {
        self.out.fill(pad, count)
    }
}

/// A rank file being appended to, its checksum taken as it goes.
struct Out {
    path: PathBuf,
    file: BufWriter<File>,
    crc: crc32fast::Hasher,
    bytes: u64,
    pads: Vec<u8>,
}

/// Pad bytes written per call when filling.
const FILL_CHUNK: usize = 64 << 10;

impl Out {
    fn create(path: &Path) -> Result<Out, RuntimeError> {
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| write_error(path, e))?;
        Ok(Out {
            path: path.to_owned(),
            file: BufWriter::with_capacity(1 << 20, file),
            crc: crc32fast::Hasher::new(),
            bytes: 0,
            pads: Vec::new(),
        })
    }

    fn finish(mut self) -> Result<FileSum, RuntimeError> {
        self.file.flush().map_err(|e| write_error(&self.path, e))?;
        Ok(FileSum {
            bytes: self.bytes,
            crc32: self.crc.finalize(),
        })
    }
}

impl Sink for Out {
    fn copy(&mut self, data: &[u8]) -> io::Result<()> {
        self.crc.update(data);
        self.bytes += data.len() as u64;
        self.file.write_all(data)
    }

    fn fill(&mut self, pad: &[u8], count: usize) -> io::Result<()> {
        let per = (FILL_CHUNK / pad.len().max(1)).max(1);
        if self.pads.len() != per * pad.len() || !self.pads.starts_with(pad) {
            self.pads = pad.repeat(per);
        }
        let mut left = count * pad.len();
        while left > 0 {
            let n = left.min(self.pads.len());
            let chunk = std::mem::take(&mut self.pads);
            let r = self.copy(&chunk[..n]);
            self.pads = chunk;
            r?;
            left -= n;
        }
        Ok(())
    }
}

fn write_error(path: &Path, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Io {
        path: path.display().to_string(),
        message: format!("cannot write: {e}"),
    }
}
