//! The source rank's half of a step: a sample validated, placed on the CP mesh, and
//! laid out in one byte buffer per CP rank (blocks in name order, then passed-through
//! features), ready to be announced and scattered.

use std::sync::Arc;

use featshard_spec::plan::Plan;
use featshard_spec::Mesh;
use tch::{Device, Tensor};

use super::pool::{buffer, BufferPool};
use super::wire;
use super::LocalSample;
use crate::error::{torch, RuntimeError, TorchContext};
use crate::pad::{place, Placed};
use crate::sample::{Features, Options};
use crate::views::fill_each;
use featshard_exec::buffer::{block_slots, fill_ranks, passthrough_slots, BufferLayout, Slot};
use featshard_exec::header::Header;

/// When a prepared sample's blocks are written into its send buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Write {
    /// In [`Preparer::prepare`]: for a loader that prepares ahead of the step, so
    /// that the writing overlaps the step before.
    #[default]
    Now,
    /// In the step, once the header is out, while the other ranks ready their receive
    /// buffers: for a sample distributed as soon as it is read.
    InStep,
}

/// How the source makes samples ready for a CP mesh: the plan (shared, never copied
/// per sample), the sample options, where the send buffers come from and when the
/// blocks are written. It holds no process group, so a loader's thread can own one.
#[derive(Clone, Debug)]
pub struct Preparer {
    plan: Arc<Plan>,
    cp: Mesh,
    opts: Options,
    pool: Option<BufferPool>,
    write: Write,
    compact: bool,
}

impl Preparer {
    /// Samples of `plan` for the CP mesh `cp`, with default options, new buffers for
    /// every sample and the blocks written at once.
    pub fn new(plan: Arc<Plan>, cp: Mesh) -> Self {
        Preparer {
            plan,
            cp,
            opts: Options::default(),
            pool: None,
            write: Write::Now,
            compact: true,
        }
    }

    /// One-hot features and maps sent as indices and masks as bits, expanded by each
    /// receiving rank into the same blocks (`true` by default), or every block dense.
    pub fn compact(mut self, compact: bool) -> Self {
        self.compact = compact;
        self
    }

    /// With these sample options (workflow, key policy, threads).
    pub fn options(mut self, opts: Options) -> Self {
        self.opts = opts;
        self
    }

    /// Send buffers from `pool`: a sample's are free again once it is dropped (after
    /// the step that distributes it).
    pub fn pool(mut self, pool: BufferPool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Blocks written when `write` says.
    pub fn write(mut self, write: Write) -> Self {
        self.write = write;
        self
    }

    /// The plan samples are prepared for.
    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// The sample options.
    pub fn sample_options(&self) -> &Options {
        &self.opts
    }

    /// Validates sample `sample`, places it and lays out every CP rank's buffer; the
    /// blocks are written now or in the step, as [`Preparer::write`] said.
    pub fn prepare(&self, sample: usize, features: &Features) -> Result<Prepared, RuntimeError> {
        let placed = place(&self.plan, self.cp, features, &self.opts)?;
        let laid_out = BufferLayout::new(slots(&self.plan, &placed, self.compact)?);
        let bytes = laid_out.bytes;
        let world = self.cp.ranks();
        let buffers = (0..world)
            .map(|_| buffer(self.pool.as_ref(), bytes, Device::Cpu).map(|(t, _)| t))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RuntimeError::Alloc {
                what: format!("sample {sample}'s rank buffers"),
                bytes,
                message: e.to_string(),
            })?;
        let mut prepared = Prepared {
            plan: Arc::clone(&self.plan),
            sample,
            announced: Header {
                sample: Some(sample),
                layout: placed.layout().clone(),
                buffer: laid_out,
                deferred: true,
            },
            buffers,
            pending: Some(Pending {
                plan: Arc::clone(&self.plan),
                placed,
                threads: self.opts.threads,
            }),
        };
        if self.write == Write::Now {
            prepared.write()?;
        }
        Ok(prepared)
    }
}

/// The slots of every rank's buffer: the placed features' blocks in name order (with
/// `compact`, those with a compact form hold it), then the passed-through features
/// (the executor's buffer contract); a passed-through tensor of a dtype no slot can
/// hold is refused by name.
fn slots(plan: &Plan, placed: &Placed, compact: bool) -> Result<Vec<Slot>, RuntimeError> {
    let mut slots = block_slots(plan, placed.exec(), compact)?;
    for name in placed.passthrough_names() {
        let kind = placed.input(&name).map(Tensor::kind);
        if let Some(k) = kind.filter(|&k| crate::kind::dtype_of(k).is_none()) {
            return Err(RuntimeError::Torch {
                feature: name,
                message: format!("dtype {k:?} cannot be passed through"),
            });
        }
    }
    slots.extend(passthrough_slots(placed.exec()));
    Ok(slots)
}

/// A sample prepared by the source rank: what it announces and every CP rank's buffer.
#[derive(Debug)]
pub struct Prepared {
    plan: Arc<Plan>,
    /// The sample's index in the serial dataset.
    sample: usize,
    pub(super) announced: Header,
    /// Views of their pool's buffers, when there is a pool: dropping the prepared
    /// sample frees them for the next one.
    pub(super) buffers: Vec<Tensor>,
    /// Blocks not written yet ([`Write::InStep`]).
    pending: Option<Pending>,
}

/// What writing the blocks of a sample takes.
#[derive(Debug)]
struct Pending {
    plan: Arc<Plan>,
    placed: Placed,
    threads: usize,
}

impl Prepared {
    /// Writes the blocks into the send buffers, if not yet written (once).
    pub fn write(&mut self) -> Result<(), RuntimeError> {
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        write_ranks(&p, &self.announced.buffer, &self.buffers)?;
        self.announced.deferred = false;
        Ok(())
    }

    /// What the rank at CP rank `rank` will receive, read back from its send buffer
    /// (written first if need be): its blocks with their DTensor metadata and the
    /// passed-through features (copies: a pool lends the buffer out again once the
    /// sample is distributed and dropped).
    pub fn local(&mut self, rank: usize) -> Result<LocalSample, RuntimeError> {
        self.write()?;
        let a = &self.announced;
        let buf = self.buffers.get(rank).ok_or(RuntimeError::NoSuchRank {
            rank,
            mesh: self.plan.mesh.named(a.layout.mesh),
        })?;
        let (mut blocks, mut passthrough) =
            wire::unpack(buf, &a.buffer.slots).map_err(|(feature, e)| torch(&feature, &e))?;
        let copy = |name: &str, x: &Tensor| {
            x.f_empty_like()
                .and_then(|mut y| y.f_copy_(x).map(|()| y))
                .feature(name)
        };
        for (name, b) in blocks.iter_mut() {
            b.tensor = copy(name, &b.tensor)?;
        }
        for (name, x) in passthrough.iter_mut() {
            *x = copy(name, x)?;
        }
        Ok(LocalSample {
            sample: self.sample,
            layout: a.layout.clone(),
            coord: a.layout.mesh.coord(rank),
            blocks,
            passthrough,
        })
    }
}

/// Writes every rank's buffer straight from the placed sample, by the executor (the
/// largest blocks of every rank first, when there are several threads).
fn write_ranks(p: &Pending, layout: &BufferLayout, buffers: &[Tensor]) -> Result<(), RuntimeError> {
    let cp = p.placed.layout().mesh;
    fill_each("the rank buffers", buffers, |bufs| {
        let coords = (0..bufs.len()).map(|rank| cp.coord(rank));
        let work = coords.zip(bufs).collect();
        fill_ranks(&p.plan, p.placed.exec(), layout, work, p.threads)
    })
}

#[cfg(test)]
impl Prepared {
    /// Drops the placed tensors a pending write needs, so that it fails.
    pub(super) fn break_pending(&mut self) {
        if let Some(p) = self.pending.as_mut() {
            p.placed.forget_arrays();
        }
    }
}
