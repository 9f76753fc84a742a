//! Every rank's safetensors file of a placed sample, written straight from the input's
//! memory map: header first, then each block in the format's data order, its base runs
//! copied and its pad regions filled as it goes. No padded tensor and no block in
//! memory; the input's pages are given back as they are read, so peak memory stays a
//! few megabytes per writing thread whatever the sample's size.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use featshard_spec::ir::DType;
use featshard_spec::plan::Plan;
use featshard_spec::shards::{Encoding, FileSum};
use featshard_spec::Coord;

use crate::blocks::{feature_blocks, FeatureBlocks};
use crate::error::ExecError;
use crate::files::{self, Metadata, Summing};
use crate::placed::Placed;
use crate::sink::Sink;

/// Writes `paths[r]` (created new) for every rank `r`, with `headers[r]` as its
/// `__metadata__`, blocks stored as `encoding` says; `threads` (at least 1) share the
/// ranks. Returns each file's sum.
pub fn write_rank_files(
    plan: &Plan,
    placed: &Placed,
    headers: &[Metadata],
    paths: &[PathBuf],
    threads: usize,
    encoding: Encoding,
) -> Result<Vec<FileSum>, ExecError> {
    let world = placed.layout.mesh.ranks();
    for (what, given) in [("headers", headers.len()), ("paths", paths.len())] {
        if given != world {
            let mesh = plan.mesh.named(placed.layout.mesh);
            return Err(ExecError::RankCount { what, given, mesh });
        }
    }
    let entries = entries(plan, placed, encoding)?;
    let ranks: Vec<usize> = (0..world).collect();
    let write = |_: &(), &rank: &usize| {
        let file = RankFile {
            entries: &entries,
            coord: placed.layout.mesh.coord(rank),
            encoding,
        };
        file.write(&paths[rank], &headers[rank])
    };
    crate::par::try_map(&ranks, threads, || (), write)
}

/// Every rank file's size in bytes before any is written (its header and its blocks),
/// so that a run too large for its disk is refused before the first byte.
pub fn rank_file_sizes(
    plan: &Plan,
    placed: &Placed,
    headers: &[Metadata],
    encoding: Encoding,
) -> Result<Vec<u64>, ExecError> {
    let entries = entries(plan, placed, encoding)?;
    let keyed = keyed(&entries, encoding);
    let data = keyed.iter().fold(0u64, |sum, (_, dtype, shape)| {
        let n = shape
            .iter()
            .fold(crate::dtype::size(*dtype) as u64, |n, &d| {
                n.saturating_mul(d as u64)
            });
        sum.saturating_add(n)
    });
    headers
        .iter()
        .map(|h| Ok((files::header(&keyed, h)?.len() as u64).saturating_add(data)))
        .collect()
}

/// Every rank file's entries, in the order safetensors lays out their data.
fn entries<'p, 'a>(
    plan: &'p Plan,
    placed: &'p Placed<'a>,
    encoding: Encoding,
) -> Result<Vec<FeatureBlocks<'p, 'a>>, ExecError> {
    let out = feature_blocks(plan, placed)?;
    let order = files::data_order(&keyed(&out, encoding));
    let mut slots: Vec<Option<FeatureBlocks>> = out.into_iter().map(Some).collect();
    Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
}

/// Every entry's name, and the dtype and shape a rank file stores it as (the same for
/// every rank: blocks of a CP plan are all one shape).
fn keyed<'e>(
    entries: &'e [FeatureBlocks],
    encoding: Encoding,
) -> Vec<(&'e str, DType, Vec<usize>)> {
    let stored = |e: &FeatureBlocks| match (encoding, e.compact_shape()) {
        (Encoding::Compact, Some(shape)) => (e.compact_dtype(), shape),
        _ => (e.dtype, e.shape.clone()),
    };
    entries
        .iter()
        .map(|e| {
            let (dtype, shape) = stored(e);
            (e.name.as_str(), dtype, shape)
        })
        .collect()
}

/// One rank's file.
struct RankFile<'r, 'p, 'a> {
    entries: &'r [FeatureBlocks<'p, 'a>],
    coord: Coord,
    encoding: Encoding,
}

impl RankFile<'_, '_, '_> {
    fn write(&self, path: &Path, header: &Metadata) -> Result<FileSum, ExecError> {
        let mut out = Out::create(path)?;
        out.copy(&files::header(&keyed(self.entries, self.encoding), header)?)
            .map_err(|e| write_error(path, e))?;
        for e in self.entries {
            match self.encoding {
                Encoding::Compact => e.write_compact(self.coord, &mut out),
                Encoding::Dense => e.write(self.coord, &mut out),
            }
            .map_err(|err| write_error(path, err))?;
        }
        out.finish()
    }
}

/// A rank file being appended to, its checksum taken as it goes.
struct Out {
    path: PathBuf,
    file: BufWriter<File>,
    sum: Summing,
    pads: Vec<u8>,
}

/// Pad bytes written per call when filling.
const FILL_CHUNK: usize = 64 << 10;

impl Out {
    fn create(path: &Path) -> Result<Out, ExecError> {
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| write_error(path, e))?;
        Ok(Out {
            path: path.to_owned(),
            file: BufWriter::with_capacity(1 << 20, file),
            sum: Summing::default(),
            pads: Vec::new(),
        })
    }

    fn finish(mut self) -> Result<FileSum, ExecError> {
        self.file.flush().map_err(|e| write_error(&self.path, e))?;
        Ok(self.sum.finish())
    }
}

impl Sink for Out {
    fn copy(&mut self, data: &[u8]) -> io::Result<()> {
        self.sum.update(data);
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

fn write_error(path: &Path, e: impl std::fmt::Display) -> ExecError {
    ExecError::Io {
        path: path.display().to_string(),
        message: format!("cannot write: {e}"),
    }
}
