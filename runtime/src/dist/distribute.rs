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
use super::ffi;
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
    /// Views of their pool's buffers, when there is a pool: dropping the prepared
    /// sample frees them for the next one.
    buffers: Vec<Tensor>,
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
    /// passed-through features (copies: a pool lends the buffer out again once the
    /// sample is distributed and dropped).
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

/// Byte buffers reused from step to step: the send buffers of a source, the receive
/// buffers of a rank. A kept buffer is lent out again once nothing refers to its memory
/// any more (the prepared sample, or every received block, was dropped), so a sample
/// still in use is never overwritten. Filling memory the process already touched costs
/// a fraction of first-touch memory (page faults; on a VM, backing by the host), and a
/// sample's buffers are as large as the sample.
#[derive(Clone, Debug, Default)]
pub struct BufferPool {
    kept: Arc<Mutex<Vec<Tensor>>>,
    /// Buffers kept at most; more are lent out and then freed.
    cap: usize,
}

impl BufferPool {
    /// A pool that keeps at most `cap` buffers.
    pub fn new(cap: usize) -> BufferPool {
        BufferPool {
            kept: Arc::default(),
            cap,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Tensor>> {
        // The list stays consistent whatever panicked while holding it.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Buffers kept, lent out or not.
    pub fn kept(&self) -> usize {
        self.lock().len()
    }

    /// Kept buffers that nothing refers to: ready to be lent out again.
    pub fn free(&self) -> usize {
        self.lock().iter().filter(|t| ffi::sole_owner(t)).count()
    }

    /// `bytes` bytes on `device`: a view of the smallest free kept buffer that fits,
    /// or of a new one (kept if there is room, making room by freeing the smallest
    /// free buffer). Its bytes are whatever was there.
    pub fn take(&self, bytes: usize, device: Device) -> Result<Tensor, tch::TchError> {
        self.lend(bytes, device).map(|(t, _)| t)
    }

    /// [`BufferPool::take`], and whether the buffer is new (its memory never touched).
    fn lend(&self, bytes: usize, device: Device) -> Result<(Tensor, bool), tch::TchError> {
        let mut kept = self.lock();
        let free = |t: &&Tensor| ffi::sole_owner(t);
        let reuse = kept
            .iter()
            .filter(free)
            .filter(|t| t.device() == device && t.numel() >= bytes)
            .min_by_key(|t| t.numel());
        if let Some(t) = reuse {
            return Ok((t.f_narrow(0, 0, bytes as i64)?, false));
        }
        let (new, _) = buffer(None, bytes, device)?;
        let lent = new.f_narrow(0, 0, bytes as i64)?;
        if kept.len() >= self.cap {
            let smallest = kept
                .iter()
                .enumerate()
                .filter(|(_, t)| ffi::sole_owner(t))
                .min_by_key(|(_, t)| t.numel())
                .map(|(i, _)| i);
            if let Some(i) = smallest {
                drop(kept.swap_remove(i));
            }
        }
        if kept.len() < self.cap {
            kept.push(new);
        }
        Ok((lent, true))
    }
}

/// `bytes` bytes on `device` from `pool`, or new without one; `true` when new (its
/// memory never touched).
fn buffer(
    pool: Option<&BufferPool>,
    bytes: usize,
    device: Device,
) -> Result<(Tensor, bool), tch::TchError> {
    match pool {
        Some(p) => p.lend(bytes, device),
        None => Tensor::f_empty([bytes as i64], (Kind::Uint8, device)).map(|t| (t, true)),
    }
}

/// Why the source has no sample for this step.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceFailure {
    /// The sample's index in the serial dataset, when known.
    pub sample: Option<usize>,
    /// What went wrong.
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
    /// The typed local blocks.
    pub local: T,
    /// Index of the sample in the serial dataset.
    pub sample: usize,
    /// The sample's layout on the mesh.
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

/// [`prepare`] into buffers from `pool`, free again once the prepared sample is dropped
/// (after the step that distributes it).
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
    let buffers = (0..world)
        .map(|_| buffer(pool, bytes, Device::Cpu).map(|(t, _)| t))
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
    distribute_with(mesh, source, None, local)
}

/// [`distribute_then`], receiving into a buffer of `pool`: the blocks of this step view
/// it, and the pool lends it out again once they are all dropped. A loop that drops
/// each sample before the next step receives into memory it already touched.
pub fn distribute_with<T>(
    mesh: &Mesh,
    source: Option<Source>,
    pool: Option<&BufferPool>,
    local: impl FnOnce(LocalSample) -> Result<T, String>,
) -> Result<T, DistError> {
    let cp = mesh.cp();
    let source_rank = cp.ranks()[0];
    let (prepared, header) = source_header(mesh.is_source(), source);
    let received = cp.broadcast_bytes(header.as_deref(), 0)?;
    let header: Header = serde_json::from_slice(&received).map_err(|e| DistError::Protocol {
        message: format!("unreadable header from rank {source_rank}: {e}"),
    })?;
    let (status, value) = match header {
        Header::Error { sample, message } => (
            Status::Source {
                rank: source_rank,
                sample,
                message,
            },
            None,
        ),
        Header::Ok {
            sample,
            layout,
            slots,
            bytes,
            deferred,
        } => {
            let announced = Announced {
                sample,
                layout,
                slots,
                bytes,
                deferred,
            };
            receive(mesh, pool, prepared, announced, local)?
        }
    };
    agree(mesh, status)?;
    value.ok_or_else(|| DistError::Protocol {
        message: "agreed on success without a local value".into(),
    })
}

/// What the source rank sends first: its prepared sample's header, or its failure.
/// Other ranks send nothing.
fn source_header(is_source: bool, source: Option<Source>) -> (Option<Prepared>, Option<Vec<u8>>) {
    match (is_source, source) {
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
    }
}

/// A sample the source's header announced.
struct Announced {
    sample: usize,
    layout: SampleLayout,
    slots: Vec<wire::Slot>,
    bytes: usize,
    deferred: bool,
}

/// This rank's part of an announced sample: the source writes and scatters its blocks,
/// every rank receives its own and runs `local` on them. Returns this rank's status and,
/// on success, its value.
fn receive<T>(
    mesh: &Mesh,
    pool: Option<&BufferPool>,
    mut prepared: Option<Prepared>,
    a: Announced,
    local: impl FnOnce(LocalSample) -> Result<T, String>,
) -> Result<(Status, Option<T>), DistError> {
    let cp = mesh.cp();
    let device = cp.device();
    let (mut buf, fresh) = buffer(pool, a.bytes, device).map_err(|e| DistError::Protocol {
        message: format!("a {}-byte buffer: {e}", a.bytes),
    })?;
    // While a deferred source writes its blocks, the others fault a new receive
    // buffer in (zeroing it), which the scatter would otherwise wait on.
    if fresh && a.deferred && prepared.is_none() {
        let zeroed = buf.f_zero_().map_err(|e| DistError::Protocol {
            message: format!("a {}-byte buffer: {e}", a.bytes),
        })?;
        drop(zeroed);
    }
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
    // Frees the send buffers for the pool's next sample.
    drop(prepared);
    let outcome = wire::unpack(&buf, &a.slots)
        .map_err(|(feature, e)| format!("feature `{feature}`: {e}"))
        .and_then(|(blocks, passthrough)| {
            local(LocalSample {
                sample: a.sample,
                coord: mesh.cp_coord(),
                layout: a.layout,
                blocks,
                passthrough,
            })
        });
    let status = match (unwritten, outcome) {
        (Some(message), _) => Status::Source {
            rank: cp.ranks()[0],
            sample: Some(a.sample),
            message,
        },
        (None, Ok(v)) => return Ok((Status::Ok, Some(v))),
        (None, Err(message)) => Status::Rank {
            rank: mesh.rank(),
            message,
        },
    };
    Ok((status, None))
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

    fn sample(values: &[f32]) -> Features {
        [("x".to_owned(), Tensor::from_slice(values))].into()
    }

    #[test]
    fn a_pool_lends_a_buffer_again_only_once_nothing_refers_to_it() {
        let pool = BufferPool::new(2);
        let (a, fresh) = pool.lend(64, Device::Cpu).expect("buffer");
        assert!(fresh);
        assert_eq!((a.numel(), pool.kept(), pool.free()), (64, 1, 0));
        // A view of the lent view, or another handle on it, still holds the memory.
        let ptr = a.data_ptr();
        let (view, handle) = (a.narrow(0, 8, 8), a.shallow_clone());
        drop(a);
        assert_eq!(pool.free(), 0);
        let (b, fresh) = pool.lend(16, Device::Cpu).expect("buffer");
        assert!(fresh, "a buffer still referred to was lent out again");
        drop(view);
        assert_eq!(pool.free(), 0);
        drop(handle);
        assert_eq!(pool.free(), 1);
        let (a, fresh) = pool.lend(32, Device::Cpu).expect("buffer");
        assert_eq!((fresh, a.data_ptr()), (false, ptr));
        drop((a, b));
        // Both are free now; the smallest that fits is lent, as a view of the size asked.
        assert_eq!((pool.kept(), pool.free()), (2, 2));
        let (c, fresh) = pool.lend(10, Device::Cpu).expect("buffer");
        assert!(!fresh);
        assert_eq!((c.numel(), pool.free()), (10, 1));
        // Full: a larger buffer replaces the free one that is too small.
        let (d, fresh) = pool.lend(100, Device::Cpu).expect("buffer");
        assert!(fresh);
        assert_eq!((pool.kept(), pool.free()), (2, 0));
        // Full and all lent out: a new buffer is lent but not kept.
        let (e, fresh) = pool.lend(8, Device::Cpu).expect("buffer");
        assert!(fresh);
        assert_eq!(pool.kept(), 2);
        drop((c, d, e));
        assert_eq!(pool.free(), 2);
    }

    #[test]
    fn a_received_sample_kept_is_never_overwritten_by_the_next_step() {
        let (_, plan) = featshard_spec::compile_str("t.yaml", SPEC).expect("spec");
        let plan = Arc::new(plan);
        let ranks = Rendezvous::in_process(2, GroupOptions::default()).expect("store");
        let threads: Vec<_> = ranks
            .into_iter()
            .map(|rdv| {
                let plan = Arc::clone(&plan);
                std::thread::spawn(move || -> Result<(), DistError> {
                    let mesh = Mesh::new(&rdv, 1, [1, 2])?;
                    let pool = BufferPool::new(1);
                    let send = |values: &[f32]| {
                        mesh.is_source().then(|| {
                            prepare(&plan, [1, 2], &Options::default(), 0, &sample(values)).map_err(
                                |e| SourceFailure {
                                    sample: Some(0),
                                    message: e.to_string(),
                                },
                            )
                        })
                    };
                    let x = |s: &LocalSample| s.blocks["x"].tensor.shallow_clone();
                    let first = distribute_with(&mesh, send(&[1., 2., 3.]), Some(&pool), Ok)?;
                    let kept = x(&first).copy();
                    // The first sample is held: the second arrives in new memory.
                    let second = distribute_with(&mesh, send(&[4., 5., 6.]), Some(&pool), Ok)?;
                    assert!(x(&first).equal(&kept));
                    assert!(!x(&second).equal(&kept));
                    assert_eq!(pool.free(), 0);
                    // Once dropped, its buffer takes the next sample.
                    let ptr = x(&first).data_ptr();
                    drop(first);
                    assert_eq!(pool.free(), 1);
                    let third = distribute_with(&mesh, send(&[7., 8., 9.]), Some(&pool), Ok)?;
                    assert_eq!(x(&third).data_ptr(), ptr);
                    assert!(x(&third).equal(&x(&second).g_add_scalar(3.)));
                    Ok(())
                })
            })
            .collect();
        for t in threads {
            t.join().expect("rank thread").expect("steps");
        }
    }

    #[test]
    fn a_deferred_source_writes_its_blocks_in_the_step() {
        let (_, plan) = featshard_spec::compile_str("t.yaml", SPEC).expect("spec");
        let features = sample(&[1., 2., 3.]);
        let p = prepare_deferred(&plan, [1, 2], &Options::default(), 7, &features, None)
            .expect("prepare");
        assert!(step(p).iter().all(Result::is_ok));
    }

    #[test]
    fn a_source_that_fails_to_write_after_its_header_fails_the_step_everywhere() {
        let (_, plan) = featshard_spec::compile_str("t.yaml", SPEC).expect("spec");
        let features = sample(&[1., 2., 3.]);
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
