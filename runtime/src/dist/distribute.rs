//! One distribution step: the source rank of each CP group announces its sample
//! (or its failure), scatters every rank exactly its block, and the whole world agrees
//! on the outcome, so that a failure anywhere is the same error everywhere.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use featshard_spec::infer::CP_AXES;
use featshard_spec::ir::DType;
use featshard_spec::plan::{Plan, SampleLayout};
use tch::{Device, Kind, Tensor};

use super::error::DistError;
use super::mesh::Mesh;
use super::wire::{self, Header, Slot, Status, STATUS_BYTES};
use crate::error::RuntimeError;
use crate::kind::kind_of;
use crate::pad::{place, Placed};
use crate::par::try_map;
use crate::sample::{tensor_plan, Features, Options};
use crate::shard::{coords, DTensorMeta, LocalBlock};

/// A sample planned by the source rank: the header and every CP rank's buffer.
#[derive(Debug)]
pub struct Prepared {
    header: Header,
    buffers: Vec<Tensor>,
    /// Where the buffers go back once scattered (their full, unnarrowed tensors).
    recycle: Option<(BufferPool, Vec<Tensor>)>,
    /// Blocks not written yet ([`prepare_deferred`]).
    pending: Option<Pending>,
}

/// What writing the blocks of a deferred sample takes.
#[derive(Debug)]
struct Pending {
    plan: Plan,
    placed: Placed,
    threads: usize,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if let Some((pool, owned)) = self.recycle.take() {
            self.buffers.clear();
            pool.give(owned);
        }
    }
}

impl Prepared {
    /// Writes the blocks of a deferred sample into the send buffers (once).
    pub fn write(&mut self) -> Result<(), RuntimeError> {
        let (Some(p), Header::Ok { slots, .. }) = (self.pending.take(), &self.header) else {
            return Ok(());
        };
        write_ranks(&p.plan, &p.placed, slots, &self.buffers, p.threads)?;
        if let Header::Ok { deferred, .. } = &mut self.header {
            *deferred = false;
        }
        Ok(())
    }

    /// What the rank at CP rank `rank` will receive, read back from its send buffer
    /// (written first if deferred): its blocks with their DTensor metadata and the
    /// passed-through features (copies: the buffer goes back to its pool when the
    /// sample is distributed or dropped).
    pub fn local(&mut self, rank: usize) -> Result<LocalSample, RuntimeError> {
        self.write()?;
        let Header::Ok {
            sample,
            layout,
            slots,
            ..
        } = &self.header
        else {
            return Err(RuntimeError::Blocks {
                feature: "*".into(),
                message: "the prepared sample holds an error".into(),
            });
        };
        let buf = self.buffers.get(rank).ok_or_else(|| RuntimeError::Blocks {
            feature: "*".into(),
            message: format!("rank {rank} of a CP group of {} ranks", self.buffers.len()),
        })?;
        let (mut blocks, mut passthrough) =
            wire::unpack(buf, slots).map_err(|(feature, e)| torch_err(&feature, e))?;
        let copy = |name: &str, x: &Tensor| {
            x.f_empty_like()
                .and_then(|mut y| y.f_copy_(x).map(|()| y))
                .map_err(|e| torch_err(name, e))
        };
        for (name, b) in blocks.iter_mut() {
            b.tensor = copy(name, &b.tensor)?;
        }
        for (name, x) in passthrough.iter_mut() {
            *x = copy(name, x)?;
        }
        Ok(LocalSample {
            sample: *sample,
            layout: layout.clone(),
            coord: coords(layout.mesh, rank),
            blocks,
            passthrough,
        })
    }
}

/// Send buffers a source reuses from sample to sample. Filling memory the process
/// already touched costs a fraction of first-touch memory (page faults; on a VM,
/// backing by the host), and a sample's buffers are as large as the sample.
#[derive(Clone, Debug, Default)]
pub struct BufferPool {
    free: Arc<Mutex<Vec<Tensor>>>,
    /// Buffers kept at most; more are freed.
    cap: usize,
}

impl BufferPool {
    /// A pool that keeps at most `cap` buffers.
    pub fn new(cap: usize) -> BufferPool {
        BufferPool {
            free: Arc::default(),
            cap,
        }
    }

    /// Buffers waiting to be reused.
    pub fn free(&self) -> usize {
        self.free.lock().map_or(0, |f| f.len())
    }

    /// A buffer of at least `bytes` (the smallest that fits), or a new one.
    fn take(&self, bytes: usize) -> Result<Tensor, tch::TchError> {
        let found = self.free.lock().ok().and_then(|mut free| {
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, t)| t.numel() >= bytes)
                .min_by_key(|(_, t)| t.numel())
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        });
        match found {
            Some(t) => Ok(t),
            None => Tensor::f_empty([bytes as i64], (Kind::Uint8, Device::Cpu)),
        }
    }

    fn give(&self, buffers: Vec<Tensor>) {
        if let Ok(mut free) = self.free.lock() {
            free.extend(buffers);
            // Keep the largest: they fit the most samples.
            free.sort_by_key(|t| std::cmp::Reverse(t.numel()));
            free.truncate(self.cap);
        }
    }
}

/// Why the source has no sample for this step.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceFailure {
    pub sample: Option<usize>,
    pub message: String,
}

/// What the source rank hands to a step.
pub type Source = Result<Prepared, SourceFailure>;

/// This rank's part of one sample.
#[derive(Debug)]
pub struct LocalSample {
    /// Index of the sample in the serial dataset.
    pub sample: usize,
    /// The sample's layout on the CP mesh (lengths, padded lengths, owner blocks).
    pub layout: SampleLayout,
    /// This rank's CP coordinate.
    pub coord: [usize; CP_AXES],
    /// Sorted by name, each with its DTensor metadata on `(cp0, cp1)`.
    pub blocks: BTreeMap<String, LocalBlock>,
    /// Features carried along untouched (replicated).
    pub passthrough: Features,
}

impl LocalSample {
    /// The local tensors, without metadata.
    pub fn tensors(&self) -> Features {
        self.blocks
            .iter()
            .map(|(n, b)| (n.clone(), b.tensor.shallow_clone()))
            .collect()
    }
}

/// A typed local sample (a derived `<Name>Local`) with what `DTensor.from_local`
/// and `assemble` need.
#[derive(Debug)]
pub struct Distributed<T> {
    pub local: T,
    /// Index of the sample in the serial dataset.
    pub sample: usize,
    pub layout: SampleLayout,
    /// DTensor metadata of every block, by feature name.
    pub meta: BTreeMap<String, DTensorMeta>,
}

impl LocalSample {
    /// Splits into the name -> tensor map and the rest, for a typed wrapper.
    pub fn typed<T>(
        self,
        from: impl FnOnce(Features) -> Result<T, RuntimeError>,
    ) -> Result<Distributed<T>, RuntimeError> {
        let meta = self
            .blocks
            .iter()
            .map(|(n, b)| (n.clone(), b.meta.clone()))
            .collect();
        let tensors = self
            .blocks
            .into_iter()
            .map(|(n, b)| (n, b.tensor))
            .collect();
        Ok(Distributed {
            local: from(tensors)?,
            sample: self.sample,
            layout: self.layout,
            meta,
        })
    }
}

fn dtype_of(name: &str, k: Kind) -> Result<DType, RuntimeError> {
    DType::ALL
        .into_iter()
        .find(|d| kind_of(*d) == k)
        .ok_or_else(|| RuntimeError::Torch {
            feature: name.to_owned(),
            message: format!("dtype {k:?} cannot be passed through"),
        })
}

/// Validates sample `sample`, places it on the CP mesh `cp` and writes every rank's
/// buffer (blocks in name order, then passed-through features).
pub fn prepare(
    plan: &Plan,
    cp: [usize; CP_AXES],
    opts: &Options,
    sample: usize,
    features: &Features,
) -> Result<Prepared, RuntimeError> {
    prepare_with(plan, cp, opts, sample, features, None)
}

/// [`prepare`] into buffers from `pool`, which gets them back after the scatter.
pub fn prepare_with(
    plan: &Plan,
    cp: [usize; CP_AXES],
    opts: &Options,
    sample: usize,
    features: &Features,
    pool: Option<&BufferPool>,
) -> Result<Prepared, RuntimeError> {
    let mut prepared = prepare_deferred(plan, cp, opts, sample, features, pool)?;
    prepared.write()?;
    Ok(prepared)
}

/// [`prepare_with`] up to the blocks: the sample is validated and placed, its buffers
/// laid out, and [`distribute`] writes the blocks once the header is out, while the
/// other ranks ready their receive buffers. For a sample distributed as soon as it is
/// read; a loader that prepares ahead writes them ahead too.
pub fn prepare_deferred(
    plan: &Plan,
    cp: [usize; CP_AXES],
    opts: &Options,
    sample: usize,
    features: &Features,
    pool: Option<&BufferPool>,
) -> Result<Prepared, RuntimeError> {
    let placed = place(plan, cp, features, opts)?;
    let mut slots = Vec::new();
    for name in placed.tensors.keys() {
        let t = tensor_plan(plan, name)?;
        let s = &placed.shapes[name];
        slots.push(Slot {
            name: name.clone(),
            dtype: t.dtype,
            local_shape: s.local_shape.clone(),
            offset: 0,
            dtensor: Some((s.global_shape.clone(), t.placements.clone())),
        });
    }
    for (name, x) in &placed.passthrough {
        let shape = x.size().iter().map(|&n| n as usize).collect();
        slots.push(Slot {
            name: name.clone(),
            dtype: dtype_of(name, x.kind())?,
            local_shape: shape,
            offset: 0,
            dtensor: None,
        });
    }
    let bytes = wire::lay_out(&mut slots);
    let world: usize = cp.iter().product();
    let owned = (0..world)
        .map(|_| match pool {
            Some(p) => p.take(bytes),
            None => Tensor::f_empty([bytes as i64], (Kind::Uint8, Device::Cpu)),
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| torch_err("*", e))?;
    let buffers = owned
        .iter()
        .map(|full| full.f_narrow(0, 0, bytes as i64))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| torch_err("*", e))?;
    Ok(Prepared {
        header: Header::Ok {
            sample,
            layout: placed.layout.clone(),
            slots,
            bytes,
            deferred: true,
        },
        buffers,
        recycle: pool.map(|p| (p.clone(), owned)),
        pending: Some(Pending {
            plan: plan.clone(),
            placed,
            threads: opts.threads,
        }),
    })
}

fn torch_err(feature: &str, e: tch::TchError) -> RuntimeError {
    RuntimeError::Torch {
        feature: feature.to_owned(),
        message: e.to_string(),
    }
}

/// Writes every rank's buffer straight from the placed sample, block by block (the
/// largest first, when there are several threads).
fn write_ranks(
    plan: &Plan,
    placed: &Placed,
    slots: &[Slot],
    buffers: &[Tensor],
    threads: usize,
) -> Result<(), RuntimeError> {
    let cp = placed.layout.mesh;
    let mut work: Vec<(usize, &Slot)> = (0..buffers.len())
        .flat_map(|rank| slots.iter().map(move |slot| (rank, slot)))
        .collect();
    work.sort_by_key(|(_, slot)| std::cmp::Reverse(slot.nbytes()));
    try_map(
        &work,
        threads,
        || {
            let buffers: Vec<Tensor> = buffers.iter().map(Tensor::shallow_clone).collect();
            (placed.shallow_clone(), buffers)
        },
        |(placed, buffers), &(rank, slot)| {
            let mut dst = wire::view(&buffers[rank], slot).map_err(|e| torch_err(&slot.name, e))?;
            match placed.passthrough.get(&slot.name) {
                Some(x) => dst.f_copy_(x).map_err(|e| torch_err(&slot.name, e)),
                None => placed
                    .write_block(plan, &slot.name, coords(cp, rank), &mut dst)
                    .map(|_| ()),
            }
        },
    )?;
    Ok(())
}

/// One step: every rank of the world calls it; `source` is read on CP sources only
/// (CP coordinate `(0, 0)`), other ranks pass `None`.
pub fn distribute(mesh: &Mesh, source: Option<Source>) -> Result<LocalSample, DistError> {
    distribute_then(mesh, source, Ok)
}

/// [`distribute`], then `local` on this rank's sample; a failure of `local` on any rank
/// (or of any source) is returned by every rank of the world, naming where it happened.
pub fn distribute_then<T>(
    mesh: &Mesh,
    source: Option<Source>,
    local: impl FnOnce(LocalSample) -> Result<T, String>,
) -> Result<T, DistError> {
    let cp = mesh.cp();
    let source_rank = cp.ranks()[0];
    let (mut prepared, header) = match (mesh.is_source(), source) {
        (true, Some(Ok(p))) => {
            let header = serde_json::to_vec(&p.header).unwrap_or_default();
            (Some(p), Some(header))
        }
        (true, failure) => {
            let header = match failure {
                Some(Err(f)) => Header::Error {
                    sample: f.sample,
                    message: f.message,
                },
                _ => Header::Error {
                    sample: None,
                    message: "no sample was given to the source rank".into(),
                },
            };
            (None, Some(serde_json::to_vec(&header).unwrap_or_default()))
        }
        (false, _) => (None, None),
    };
    let received = cp.broadcast_bytes(header.as_deref(), 0)?;
    let header: Header = serde_json::from_slice(&received).map_err(|e| DistError::Protocol {
        message: format!("unreadable header from rank {source_rank}: {e}"),
    })?;
    let mut value = None;
    let status = match header {
        Header::Error { sample, message } => Status::Source {
            rank: source_rank,
            sample,
            message,
        },
        Header::Ok {
            sample,
            layout,
            slots,
            bytes,
            deferred,
        } => {
            let device = cp.device();
            // While a deferred source writes its blocks, the others fault their receive
            // buffers in (zeroing them), which the scatter would otherwise wait on.
            let size = [bytes as i64];
            let buf = if deferred && prepared.is_none() {
                Tensor::f_zeros(size, (Kind::Uint8, device))
            } else {
                Tensor::f_empty(size, (Kind::Uint8, device))
            };
            let mut buf = buf.map_err(|e| DistError::Protocol {
                message: format!("a {bytes}-byte buffer: {e}"),
            })?;
            // A source that fails to write after its header still takes part in the
            // scatter; the status agreement then fails the step everywhere.
            let unwritten = prepared
                .as_mut()
                .and_then(|p| p.write().err())
                .map(|e| e.to_string());
            // NCCL scatters device memory; gloo takes the CPU buffers as they are.
            let buffers: Option<Vec<Tensor>> = prepared.as_ref().map(|p| {
                p.buffers
                    .iter()
                    .map(|b| {
                        if device == Device::Cpu {
                            b.shallow_clone()
                        } else {
                            b.to_device(device)
                        }
                    })
                    .collect()
            });
            cp.scatter(&mut buf, buffers.as_deref(), 0)?;
            drop(buffers);
            // The send buffers go back to their pool.
            drop(prepared);
            let outcome = wire::unpack(&buf, &slots)
                .map_err(|(feature, e)| format!("feature `{feature}`: {e}"))
                .and_then(|(blocks, passthrough)| {
                    local(LocalSample {
                        sample,
                        coord: mesh.cp_coord(),
                        layout,
                        blocks,
                        passthrough,
                    })
                });
            match (unwritten, outcome) {
                (Some(message), _) => Status::Source {
                    rank: source_rank,
                    sample: Some(sample),
                    message,
                },
                (None, Ok(v)) => {
                    value = Some(v);
                    Status::Ok
                }
                (None, Err(message)) => Status::Rank {
                    rank: mesh.rank(),
                    message,
                },
            }
        }
    };
    agree(mesh, status)?;
    value.ok_or_else(|| DistError::Protocol {
        message: "agreed on success without a local value".into(),
    })
}

/// Every rank's status of this step, gathered over the world; the first failure in
/// rank order becomes every rank's error.
fn agree(mesh: &Mesh, status: Status) -> Result<(), DistError> {
    let mine = Tensor::from_slice(&status.encode()).to_device(mesh.world().device());
    let all = mesh.world().all_gather(&mine)?;
    for (rank, t) in all.iter().enumerate() {
        let t = t.to_device(Device::Cpu);
        let mut bytes = vec![0u8; STATUS_BYTES];
        t.f_copy_data_u8(&mut bytes, STATUS_BYTES)
            .map_err(|e| DistError::Protocol {
                message: e.to_string(),
            })?;
        match Status::decode(&bytes) {
            Some(Status::Ok) => {}
            Some(Status::Source {
                rank,
                sample,
                message,
            }) => {
                return Err(DistError::Source {
                    rank,
                    sample,
                    message,
                })
            }
            Some(Status::Rank { rank, message }) => return Err(DistError::Rank { rank, message }),
            None => {
                return Err(DistError::Protocol {
                    message: format!("unreadable status from rank {rank}"),
                })
            }
        }
    }
    Ok(())
}

/// Agrees on a rank-local outcome outside a distribution step (e.g. after a model
/// step): every rank returns the first failure in rank order, or `Ok`.
pub fn agree_on(mesh: &Mesh, local: Result<(), String>) -> Result<(), DistError> {
    agree(
        mesh,
        match local {
            Ok(()) => Status::Ok,
            Err(message) => Status::Rank {
                rank: mesh.rank(),
                message,
            },
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::{GroupOptions, Rendezvous};

    const SPEC: &str = "\
version: 1
module: t
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true}
features:
  x: {axes: [tokens], dtype: float32}
";

    /// Runs one step on a 1x2 CP mesh of threads, `source` on rank 0.
    fn step(source: Prepared) -> Vec<Result<(), DistError>> {
        let mut source = Some(source);
        let ranks = Rendezvous::in_process(2, GroupOptions::default()).expect("store");
        let threads: Vec<_> = ranks
            .into_iter()
            .map(|rdv| {
                let mine = source.take();
                std::thread::spawn(move || {
                    let mesh = Mesh::new(&rdv, 1, [1, 2])?;
                    distribute(&mesh, mine.map(Ok)).map(|_| ())
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank thread"))
            .collect()
    }

    #[test]
    fn a_deferred_source_writes_its_blocks_in_the_step() {
        let (_, plan) = featshard_spec::compile_str("t.yaml", SPEC).expect("spec");
        let features: Features = [("x".to_owned(), Tensor::from_slice(&[1f32, 2., 3.]))].into();
        let p = prepare_deferred(&plan, [1, 2], &Options::default(), 7, &features, None)
            .expect("prepare");
        assert!(step(p).iter().all(Result::is_ok));
    }

    #[test]
    fn a_source_that_fails_to_write_after_its_header_fails_the_step_everywhere() {
        let (_, plan) = featshard_spec::compile_str("t.yaml", SPEC).expect("spec");
        let features: Features = [("x".to_owned(), Tensor::from_slice(&[1f32, 2., 3.]))].into();
        let mut p = prepare_deferred(&plan, [1, 2], &Options::default(), 7, &features, None)
            .expect("prepare");
        // The header is sound, but the blocks cannot be written.
        if let Some(pending) = p.pending.as_mut() {
            pending.placed.tensors.clear();
        }
        for outcome in step(p) {
            match outcome {
                Err(DistError::Source {
                    rank: 0,
                    sample: Some(7),
                    message,
                }) => assert_eq!(message, "feature `x`: missing from the sample"),
                other => panic!("expected the source's failure, got {other:?}"),
            }
        }
    }
}
