//! Sharded data loading: a serial dataset, split over DP replicas like a distributed
//! sampler, read and planned by each CP group's source rank in a background thread.

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::sync::OnceLock;
use std::thread::JoinHandle;

use featshard_spec::plan::Plan;
use featshard_spec::replicas::replica_indices;
pub use featshard_spec::replicas::Order;

use super::collate::{collate, Batch};
use super::distribute::{Distributor, Source, SourceFailure};
use super::error::DistError;
use super::local::LocalSample;
use super::mesh::Mesh;
use super::pool::BufferPool;
use super::prepare::Preparer;
use crate::sample::{Features, Options};

/// A dataset of serial (unpadded, unsharded) samples, read on source ranks only.
pub trait SerialDataset: Send + Sync {
    /// How many samples the dataset holds.
    fn len(&self) -> usize;

    /// Whether the dataset holds no sample.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `index`, or why it cannot be read.
    fn get(&self, index: usize) -> Result<Features, String>;
}

/// How a loader batches, orders and retries.
#[derive(Clone, Debug)]
pub struct LoaderOptions {
    /// Samples per batch on each DP replica.
    pub batch_size: usize,
    /// The order of samples.
    pub order: Order,
    /// Drop the tail that does not fill every replica; otherwise wrap around to the
    /// start so every replica gets the same number of samples.
    pub drop_last: bool,
    /// A failing sample is replaced by the next one, at most this many times in a row.
    pub retries: usize,
    /// Samples the source prepares ahead of the step that needs them.
    pub prefetch: usize,
    /// Workflow, passthrough and threads of the source's sample preparation.
    pub sample: Options,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 1,
            order: Order::Sequential,
            drop_last: false,
            retries: 0,
            prefetch: 2,
            sample: Options::default(),
        }
    }
}

/// Splits a dataset over the DP replicas of a mesh and distributes each sample over
/// its replica's CP group.
pub struct ShardedLoader<D> {
    dataset: Arc<D>,
    plan: Arc<Plan>,
    opts: LoaderOptions,
    /// The source's send buffers, kept from epoch to epoch (sized at the first epoch).
    pool: OnceLock<BufferPool>,
    /// This rank's receive buffers: one per sample of a batch, and one more for a
    /// sample kept while the next arrives.
    recv: BufferPool,
}

impl<D: SerialDataset + 'static> ShardedLoader<D> {
    /// A loader over `dataset` for `plan`; refuses a batch size of 0.
    pub fn new(dataset: Arc<D>, plan: Arc<Plan>, opts: LoaderOptions) -> Result<Self, DistError> {
        if opts.batch_size == 0 {
            return Err(DistError::Setup {
                message: "loader: batch_size must be at least 1".into(),
            });
        }
        Ok(ShardedLoader {
            dataset,
            plan,
            recv: BufferPool::new(opts.batch_size + 1),
            opts,
            pool: OnceLock::new(),
        })
    }

    /// The samples replica `replica` of `dp` reads in `epoch`, in order.
    pub fn indices(&self, epoch: u64, dp: usize, replica: usize) -> Vec<usize> {
        replica_indices(
            self.dataset.len(),
            self.opts.order,
            epoch,
            dp,
            replica,
            self.opts.drop_last,
        )
    }

    /// Batches per epoch on every replica.
    pub fn steps(&self, dp: usize) -> usize {
        self.indices(0, dp, 0).len().div_ceil(self.opts.batch_size)
    }

    /// One epoch of collated batches on this rank: every rank of the world iterates
    /// it in step. Stops after the first error, which every rank returns.
    pub fn epoch<'m>(&self, mesh: &'m Mesh, epoch: u64) -> Epoch<'m> {
        let samples = self.samples(mesh, epoch);
        let n = samples.remaining;
        let sizes: Vec<usize> = (0..n)
            .step_by(self.opts.batch_size)
            .map(|k| self.opts.batch_size.min(n - k))
            .collect();
        Epoch {
            samples,
            sizes: sizes.into_iter(),
        }
    }

    /// One epoch of single distributed samples (no collate) on this rank.
    pub fn samples<'m>(&self, mesh: &'m Mesh, epoch: u64) -> Samples<'m> {
        let indices = self.indices(epoch, mesh.dp_size(), mesh.dp_index());
        let remaining = indices.len();
        // The worker holds one prepared sample while it waits to hand it over, so
        // `prefetch` samples ahead take a channel of `prefetch - 1`.
        let ahead = self.opts.prefetch.max(1);
        let cp = mesh.cp_shape();
        // Every rank's buffer of the samples in flight: prefetched + one scattering.
        let send = self
            .pool
            .get_or_init(|| BufferPool::new(cp.ranks() * (ahead + 1)));
        let distributor = Distributor::new(mesh, Arc::clone(&self.plan))
            .options(self.opts.sample.clone())
            .send_pool(send.clone())
            .recv_pool(self.recv.clone());
        let (rx, worker) = if mesh.is_source() {
            let (tx, rx) = sync_channel(ahead - 1);
            let dataset = Arc::clone(&self.dataset);
            let preparer = distributor.preparer().clone();
            let retries = self.opts.retries;
            let worker = std::thread::spawn(move || {
                for index in indices {
                    let source = fetch(dataset.as_ref(), &preparer, retries, index);
                    if tx.send(source).is_err() {
                        return; // the iterator was dropped
                    }
                }
            });
            (Some(rx), Some(worker))
        } else {
            (None, None)
        };
        Samples {
            distributor,
            remaining,
            rx,
            worker,
            done: false,
        }
    }
}

/// Reads and plans `index`; a failing sample is replaced by the next one, `retries`
/// times at most.
fn fetch<D: SerialDataset>(
    dataset: &D,
    preparer: &Preparer,
    retries: usize,
    index: usize,
) -> Source {
    let n = dataset.len();
    let mut last = SourceFailure {
        sample: Some(index),
        message: "empty dataset".into(),
    };
    for k in 0..=retries {
        let i = (index + k) % n.max(1);
        let attempt = dataset
            .get(i)
            .and_then(|features| preparer.prepare(i, &features).map_err(|e| e.to_string()));
        match attempt {
            Ok(prepared) => return Ok(prepared),
            Err(message) => {
                last = SourceFailure {
                    sample: Some(i),
                    message: if k == 0 {
                        message
                    } else {
                        format!("{message} (after {k} retries from sample {index})")
                    },
                }
            }
        }
    }
    Err(last)
}

/// The distributed samples of one epoch on this rank.
pub struct Samples<'m> {
    distributor: Distributor<'m>,
    remaining: usize,
    rx: Option<Receiver<Source>>,
    worker: Option<JoinHandle<()>>,
    done: bool,
}

impl Iterator for Samples<'_> {
    type Item = Result<LocalSample, DistError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let source = self.rx.as_ref().map(|rx| {
            rx.recv().unwrap_or_else(|_| {
                Err(SourceFailure {
                    sample: None,
                    message: "the loading thread stopped (it panicked in the dataset)".into(),
                })
            })
        });
        let out = self.distributor.step(source);
        self.done = out.is_err();
        Some(out)
    }
}

impl Drop for Samples<'_> {
    fn drop(&mut self) {
        // Closing the channel ends the worker at its next send.
        self.rx = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// The collated batches of one epoch on this rank.
pub struct Epoch<'m> {
    samples: Samples<'m>,
    sizes: std::vec::IntoIter<usize>,
}

impl Iterator for Epoch<'_> {
    type Item = Result<Batch, DistError>;

    fn next(&mut self) -> Option<Self::Item> {
        let size = self.sizes.next()?;
        let batch: Result<Vec<LocalSample>, DistError> = (&mut self.samples).take(size).collect();
        let d = &self.samples.distributor;
        let out = batch.and_then(|b| collate(d.mesh(), d.preparer().plan(), b));
        if out.is_err() {
            self.samples.done = true;
            self.sizes = Vec::new().into_iter();
        }
        Some(out)
    }
}
