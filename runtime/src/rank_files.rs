//! Every rank's safetensors file of a placed sample, written straight from the serial
//! tensors: each block is written into one reused buffer (serial runs copied, pad
//! regions filled), then appended to its file. No padded global tensor and no whole
//! file in memory; features go in the files' data order, one at a time, and each is
//! dropped once every rank has it, so a memory-mapped input leaves memory as it goes.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use tch::{Kind, Tensor};

use crate::error::{RuntimeError, TorchContext};
use crate::files::{self, Metadata};
use crate::mapping::{Mapping, Pages};
use crate::pad::{dims, Placed};
use crate::shard::coords;
use featshard_spec::plan::Plan;

pub use featshard_spec::shards::FileSum;

/// More files than this are not held open at once: ranks are written in batches.
const MAX_OPEN_FILES: usize = 256;

/// Writes `paths[r]` (created new) for every rank `r`, with `headers[r]` as its
/// `__metadata__`; `threads` (at least 1) share the ranks. Returns each file's sum.
///
/// With the `mapping` the sample's tensors view, the sample's pages are given back
/// first (those validation touched), then each feature's rows as soon as no later rank
/// of a batch reads them: a pair feature leaves memory block row by block row.
pub fn write_rank_files(
    plan: &Plan,
    placed: Placed,
    mapping: Option<&Mapping>,
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
    let pages = mapping.map(Mapping::pages);
    if let Some(p) = pages {
        p.release_all();
    }
    let order = data_order(&placed)?;
    let threads = threads.clamp(1, world.max(1));
    let batch = world.div_ceil(threads).min(MAX_OPEN_FILES);
    // Each batch holds its own handles; a feature's memory goes with the last of them.
    let mut jobs: Vec<Vec<(Vec<usize>, Placed)>> = (0..threads).map(|_| Vec::new()).collect();
    for (k, start) in (0..world).step_by(batch).enumerate() {
        let ranks = (start..(start + batch).min(world)).collect();
        jobs[k % threads].push((ranks, placed.shallow_clone()));
    }
    drop(placed);
    let batch = |ranks: &[usize], placed: Placed| {
        let b = Batch {
            plan,
            pages,
            ranks,
            headers,
            paths,
        };
        b.write(placed, &order)
    };
    let mut sums = vec![FileSum { bytes: 0, crc32: 0 }; world];
    for (rank, sum) in run_jobs(jobs, &batch)? {
        sums[rank] = sum;
    }
    Ok(sums)
}

/// Runs every thread's batches on a thread of its own; each rank's sum, in any order.
fn run_jobs(
    jobs: Vec<Vec<(Vec<usize>, Placed)>>,
    batch: &(impl Fn(&[usize], Placed) -> Result<Vec<FileSum>, RuntimeError> + Sync),
) -> Result<Vec<(usize, FileSum)>, RuntimeError> {
    let done: Vec<Result<Vec<(usize, FileSum)>, RuntimeError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = jobs
            .into_iter()
            .map(|mine| {
                scope.spawn(move || {
                    let mut sums = Vec::new();
                    for (ranks, placed) in mine {
                        let s = batch(&ranks, placed)?;
                        sums.extend(ranks.into_iter().zip(s));
                    }
                    Ok(sums)
                })
            })
            .collect();
        workers
            .into_iter()
            // A panic while writing is a bug, not an input error: it propagates.
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    Ok(done
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect())
}

/// One entry of a rank file: name, dtype, block shape, and whether it is carried along.
struct Entry {
    name: String,
    kind: Kind,
    shape: Vec<usize>,
    passthrough: bool,
}

/// The entries of every rank file, in the order safetensors lays out their data.
fn data_order(placed: &Placed) -> Result<Vec<Entry>, RuntimeError> {
    let mut entries = Vec::new();
    for (name, x) in &placed.tensors {
        let (_, shapes) = placed.feature(name)?;
        entries.push(Entry {
            name: name.clone(),
            kind: x.kind(),
            shape: shapes.local_shape.clone(),
            passthrough: false,
        });
    }
    for (name, x) in &placed.passthrough {
        entries.push(Entry {
            name: name.clone(),
            kind: x.kind(),
            shape: x.size().iter().map(|&d| d as usize).collect(),
            passthrough: true,
        });
    }
    let keyed: Vec<(&str, Kind, Vec<usize>)> = entries
        .iter()
        .map(|e| (e.name.as_str(), e.kind, e.shape.clone()))
        .collect();
    let order = files::data_order(&keyed)?;
    let mut slots: Vec<Option<Entry>> = entries.into_iter().map(Some).collect();
    Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
}

/// A rank file being appended to, its checksum taken as it goes.
struct Out {
    path: PathBuf,
    file: BufWriter<File>,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl Out {
    fn create(path: &Path) -> Result<Out, RuntimeError> {
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| io(path, e))?;
        Ok(Out {
            path: path.to_owned(),
            file: BufWriter::with_capacity(1 << 20, file),
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        })
    }

    fn append(&mut self, data: &[u8]) -> Result<(), RuntimeError> {
        self.crc.update(data);
        self.bytes += data.len() as u64;
        self.file.write_all(data).map_err(|e| io(&self.path, e))
    }

    fn finish(mut self) -> Result<FileSum, RuntimeError> {
        self.file.flush().map_err(|e| io(&self.path, e))?;
        Ok(FileSum {
            bytes: self.bytes,
            crc32: self.crc.finalize(),
        })
    }
}

fn io(path: &Path, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Io {
        path: path.display().to_string(),
        message: format!("cannot write: {e}"),
    }
}

/// The ranks one thread writes, and what it writes them with.
struct Batch<'a> {
    plan: &'a Plan,
    pages: Option<Pages<'a>>,
    ranks: &'a [usize],
    headers: &'a [Metadata],
    paths: &'a [PathBuf],
}

impl Batch<'_> {
    /// Writes the files of the batch's ranks, feature by feature, dropping each
    /// feature after it.
    fn write(&self, mut placed: Placed, order: &[Entry]) -> Result<Vec<FileSum>, RuntimeError> {
        let keyed: Vec<(&str, Kind, Vec<usize>)> = order
            .iter()
            .map(|e| (e.name.as_str(), e.kind, e.shape.clone()))
            .collect();
        let mut outs = Vec::with_capacity(self.ranks.len());
        for &r in self.ranks {
            let mut out = Out::create(&self.paths[r])?;
            out.append(&files::header(&keyed, &self.headers[r])?)?;
            outs.push(out);
        }
        let mut bytes = Vec::new();
        for e in order {
            if e.passthrough {
                let x = &placed.passthrough[&e.name];
                let data = files::tensor_bytes(&e.name, x)?;
                for out in &mut outs {
                    out.append(&data)?;
                }
                self.release_rows(x, 0, x.size().first().copied().unwrap_or(0));
                placed.passthrough.remove(&e.name);
            } else {
                self.write_feature(&placed, e, &mut outs, &mut bytes)?;
                placed.tensors.remove(&e.name);
            }
        }
        outs.into_iter().map(Out::finish).collect()
    }

    /// One feature's block on every rank of the batch, in rank order; the rows no later
    /// rank of the batch reads are given back as it goes.
    fn write_feature(
        &self,
        placed: &Placed,
        e: &Entry,
        outs: &mut [Out],
        bytes: &mut Vec<u8>,
    ) -> Result<(), RuntimeError> {
        let mesh = placed.layout.mesh;
        let mut block = Tensor::f_empty(dims(&e.shape).as_slice(), (e.kind, tch::Device::Cpu))
            .feature(&e.name)?;
        let numel = block.numel();
        bytes.resize(numel * e.kind.elt_size_in_bytes(), 0);
        let reads = self
            .ranks
            .iter()
            .map(|&r| placed.rows_read(self.plan, &e.name, coords(mesh, r)))
            .collect::<Result<Vec<_>, _>>()?;
        let (x, _) = placed.feature(&e.name)?;
        let rows = x.size().first().copied().unwrap_or(0);
        let mut released = 0;
        for (k, (out, &r)) in outs.iter_mut().zip(self.ranks).enumerate() {
            placed.write_block(self.plan, &e.name, coords(mesh, r), &mut block)?;
            block.f_copy_data_u8(bytes, numel).feature(&e.name)?;
            out.append(bytes)?;
            let needed = reads[k + 1..]
                .iter()
                .flatten()
                .map(|&(first, _)| first)
                .min();
            let done = needed.unwrap_or(rows);
            if done > released {
                self.release_rows(x, released, done);
                released = done;
            }
        }
        Ok(())
    }

    /// Gives back the pages of rows `from..to` of a tensor that views the mapping.
    fn release_rows(&self, x: &Tensor, from: i64, to: i64) {
        let (Some(m), Some(&stride)) = (self.pages, x.stride().first()) else {
            return;
        };
        let row = (stride.max(0) as usize) * x.kind().elt_size_in_bytes();
        let at = x.data_ptr() as usize + from as usize * row;
        m.release(at, (to - from) as usize * row);
    }
}
