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
use crate::pad::pad;
use crate::sample::{tensor_plan, Features, Options};
use crate::shard::{DTensorMeta, LocalBlock};

/// A sample planned by the source rank: the header and every CP rank's buffer.
#[derive(Debug)]
pub struct Prepared {
    header: Header,
    buffers: Vec<Tensor>,
    /// Where the buffers go back once scattered (their full, unnarrowed tensors).
    recycle: Option<(BufferPool, Vec<Tensor>)>,
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

/// Pads sample `sample` for the CP mesh `cp` and lays out every rank's buffer
/// (blocks in name order, then passed-through features).
pub fn prepare(
    plan: &Plan,
    cp: [usize; CP_AXES],
    opts: &Options,
    sample: usize,
    features: &Features,
) -> Result<Prepared, RuntimeError> {
    prepare_with(plan, cp, opts, sample, features, None)
}

/// [`prepare`] into buffers from `pool`, which get them back after the scatter.
pub fn prepare_with(
    plan: &Plan,
    cp: [usize; CP_AXES],
    opts: &Options,
    sample: usize,
    features: &Features,
    pool: Option<&BufferPool>,
) -> Result<Prepared, RuntimeError> {
    let padded = pad(plan, cp, features, opts)?;
    let mut entries = Vec::new();
    for name in padded.tensors.keys() {
        let t = tensor_plan(plan, name)?;
        let s = &padded.shapes[name];
        entries.push(Slot {
            name: name.clone(),
            dtype: t.dtype,
            local_shape: s.local_shape.clone(),
            offset: 0,
            dtensor: Some((s.global_shape.clone(), t.placements.clone())),
        });
    }
    for (name, x) in &padded.passthrough {
        let shape = x.size().iter().map(|&n| n as usize).collect();
        entries.push(Slot {
            name: name.clone(),
            dtype: dtype_of(name, x.kind())?,
            local_shape: shape,
            offset: 0,
            dtensor: None,
        });
    }
    let bytes = wire::lay_out(&mut entries);
    let slots = entries;
    let world: usize = cp.iter().product();
    let mut buffers = Vec::with_capacity(world);
    let mut owned = Vec::with_capacity(world);
    let torch_err = |feature: String, e: tch::TchError| RuntimeError::Torch {
        feature,
        message: e.to_string(),
    };
    for rank in 0..world {
        let blocks = padded.rank_blocks(plan, rank)?;
        let tensors: Vec<&Tensor> = blocks
            .values()
            .map(|b| &b.tensor)
            .chain(padded.passthrough.values())
            .collect();
        let full = match pool {
            Some(p) => p.take(bytes),
            None => Tensor::f_empty([bytes as i64], (Kind::Uint8, Device::Cpu)),
        }
        .map_err(|e| torch_err("*".into(), e))?;
        let buf = full
            .f_narrow(0, 0, bytes as i64)
            .map_err(|e| torch_err("*".into(), e))?;
        wire::fill(&buf, &slots, &tensors).map_err(|(feature, e)| torch_err(feature, e))?;
        buffers.push(buf);
        owned.push(full);
    }
    Ok(Prepared {
        header: Header::Ok {
            sample,
            layout: padded.layout,
            slots,
            bytes,
        },
        buffers,
        recycle: pool.map(|p| (p.clone(), owned)),
    })
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
    let mut recycle = None;
    let (header, buffers) = match (mesh.is_source(), source) {
        (true, Some(Ok(p))) => {
            recycle = p.recycle;
            (Some(p.header), Some(p.buffers))
        }
        (true, Some(Err(f))) => (
            Some(Header::Error {
                sample: f.sample,
                message: f.message,
            }),
            None,
        ),
        (true, None) => (
            Some(Header::Error {
                sample: None,
                message: "no sample was given to the source rank".into(),
            }),
            None,
        ),
        (false, _) => (None, None),
    };
    let header_bytes = header.map(|h| serde_json::to_vec(&h).unwrap_or_default());
    let received = cp.broadcast_bytes(header_bytes.as_deref(), 0)?;
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
        } => {
            let device = cp.device();
            let mut buf = Tensor::f_empty([bytes as i64], (Kind::Uint8, device)).map_err(|e| {
                DistError::Protocol {
                    message: format!("a {bytes}-byte buffer: {e}"),
                }
            })?;
            // NCCL scatters device memory; gloo takes the CPU buffers as they are.
            let buffers: Option<Vec<Tensor>> = buffers.map(|bs| {
                if device == Device::Cpu {
                    bs
                } else {
                    bs.iter().map(|b| b.to_device(device)).collect()
                }
            });
            cp.scatter(&mut buf, buffers.as_deref(), 0)?;
            drop(buffers);
            if let Some((pool, owned)) = recycle.take() {
                pool.give(owned);
            }
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
            match outcome {
                Ok(v) => {
                    value = Some(v);
                    Status::Ok
                }
                Err(message) => Status::Rank {
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
