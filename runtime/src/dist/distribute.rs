//! One distribution step: the source rank of each CP group announces its sample
//! (or its failure), scatters every rank exactly its block, and the whole world agrees
//! on the outcome, so that a failure anywhere is the same error everywhere (one small
//! all-reduce when all went well; every rank's status frame only after a failure).

use std::fmt::Display;
use std::sync::Arc;

use featshard_spec::plan::Plan;
use tch::{Device, Tensor};

use super::agree::agree;
use super::error::DistError;
use super::mesh::Mesh;
use super::pool::{buffer, BufferPool};
use super::prepare::{Prepared, Preparer, Write};
use super::wire;
use super::LocalSample;
use crate::error::RuntimeError;
use crate::sample::{Features, Options};
use featshard_exec::agree::{Status, Terms};
use featshard_exec::header::Header;

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

/// Distributes samples over the CP groups of a mesh: every rank of the world holds
/// one and calls [`Distributor::step`] in step with the others. On the source rank of
/// a group (CP coordinate `(0, 0)`) it also prepares the samples; its [`Preparer`]
/// can be cloned out for a loading thread.
#[derive(Debug)]
pub struct Distributor<'m> {
    mesh: &'m Mesh,
    preparer: Preparer,
    /// This rank's receive buffers; new ones every step without.
    recv: Option<BufferPool>,
}

impl<'m> Distributor<'m> {
    /// Samples of `plan` over `mesh`: default options, new buffers every step, the
    /// blocks written at once.
    pub fn new(mesh: &'m Mesh, plan: Arc<Plan>) -> Self {
        Distributor {
            mesh,
            preparer: Preparer::new(plan, mesh.cp_shape()),
            recv: None,
        }
    }

    /// With these sample options (workflow, key policy, threads).
    pub fn options(mut self, opts: Options) -> Self {
        self.preparer = self.preparer.options(opts);
        self
    }

    /// The source's send buffers from `pool` (room for the CP group's buffers of
    /// every sample in flight).
    pub fn send_pool(mut self, pool: BufferPool) -> Self {
        self.preparer = self.preparer.pool(pool);
        self
    }

    /// This rank's receive buffers from `pool`: the blocks of a step view one, and the
    /// pool lends it out again once they are all dropped, so a loop that drops each
    /// sample before the next step receives into memory it already touched.
    pub fn recv_pool(mut self, pool: BufferPool) -> Self {
        self.recv = Some(pool);
        self
    }

    /// The source's blocks written when `write` says.
    pub fn write(mut self, write: Write) -> Self {
        self.preparer = self.preparer.write(write);
        self
    }

    /// The mesh it distributes over.
    pub fn mesh(&self) -> &'m Mesh {
        self.mesh
    }

    /// How the source prepares samples (clone it for a loading thread).
    pub fn preparer(&self) -> &Preparer {
        &self.preparer
    }

    /// [`Preparer::prepare`]: sample `sample`, made ready for a step on the source.
    pub fn prepare(&self, sample: usize, features: &Features) -> Result<Prepared, RuntimeError> {
        self.preparer.prepare(sample, features)
    }

    /// Prepares `sample` on the source rank (where it is `Some`) and distributes it:
    /// [`Distributor::step`], with a failure to prepare announced as the source's.
    pub fn send(&self, sample: Option<(usize, &Features)>) -> Result<LocalSample, DistError> {
        let source = sample.map(|(index, features)| {
            self.prepare(index, features).map_err(|e| SourceFailure {
                sample: Some(index),
                message: e.to_string(),
            })
        });
        self.step(source)
    }

    /// One step: every rank of the world calls it; `source` is read on CP sources only,
    /// other ranks pass `None`. Returns this rank's part of the sample.
    pub fn step(&self, source: Option<Source>) -> Result<LocalSample, DistError> {
        self.step_then(source, Ok::<_, RuntimeError>)
    }

    /// [`Distributor::step`], then `local` on this rank's sample; a failure of `local`
    /// on any rank (or of any source) is returned by every rank of the world, naming
    /// where it happened.
    pub fn step_then<T, E: Display>(
        &self,
        source: Option<Source>,
        local: impl FnOnce(LocalSample) -> Result<T, E>,
    ) -> Result<T, DistError> {
        let cp = self.mesh.cp();
        let world = self.mesh.world();
        let (prepared, status) = source_status(self.mesh.is_source(), cp.ranks()[0], source);
        // Before any rank waits on another: the same spec, workflow, mesh and source
        // everywhere, and a sample the source could prepare.
        agree(world, status, Some(&self.terms()))?;
        let header = prepared
            .as_ref()
            .map(|p| p.announced.to_bytes())
            .transpose()?;
        let received = cp.broadcast_bytes(header.as_deref(), 0)?;
        let unreadable = |e: String| DistError::Protocol {
            message: format!("unreadable header from rank {}: {e}", cp.ranks()[0]),
        };
        let announced = Header::from_bytes(&received).map_err(unreadable)?;
        let sample = announced
            .sample
            .ok_or_else(|| unreadable("it names no sample".into()))?;
        let (status, value) = self.receive(prepared, (sample, announced), local)?;
        agree(world, status, None)?;
        value.ok_or_else(|| DistError::Protocol {
            message: "agreed on success without a local value".into(),
        })
    }

    /// What every rank of a step must hold the same (`featshard_exec::agree::Terms`):
    /// the spec, the workflow, the mesh (`dp` first, then the spec's CP axes; its ranks
    /// row-major) and the source (CP group rank 0).
    fn terms(&self) -> Terms {
        let plan = self.preparer.plan();
        let cp = self.mesh.cp_shape();
        let dp_name = plan.mesh.dp.clone().unwrap_or_else(|| "dp".to_owned());
        let mut axes = vec![(dp_name, self.mesh.dp_size())];
        axes.extend(
            plan.mesh
                .axes()
                .iter()
                .cloned()
                .zip(cp.sizes().iter().copied()),
        );
        let world: Vec<usize> = (0..self.mesh.world().size()).collect();
        let workflow = self.preparer.sample_options().workflow.as_deref();
        Terms::new(&plan.source.sha256, workflow, &axes, &world, Some(0))
    }

    /// This rank's part of an announced sample: the source writes and scatters its
    /// blocks, every rank receives its own and runs `local` on them. Returns this
    /// rank's status and, on success, its value.
    fn receive<T, E: Display>(
        &self,
        mut prepared: Option<Prepared>,
        (sample, a): (usize, Header),
        local: impl FnOnce(LocalSample) -> Result<T, E>,
    ) -> Result<(Status, Option<T>), DistError> {
        let cp = self.mesh.cp();
        // One pooled buffer: the bytes received, then room for compact blocks' dense
        // blocks, so that both reuse memory from step to step.
        let whole = self.receive_buffer(&a, prepared.is_none())?;
        let narrow = |at: usize, n: usize| {
            whole
                .f_narrow(0, at as i64, n as i64)
                .map_err(|e| DistError::Protocol {
                    message: format!("a {}-byte buffer: {e}", a.buffer.bytes),
                })
        };
        let (mut buf, room) = (
            narrow(0, a.buffer.bytes)?,
            narrow(a.buffer.room_at(), a.buffer.expanded_bytes())?,
        );
        // A source that fails to write after its header still takes part in the
        // scatter; the status agreement then fails the step everywhere.
        let unwritten = prepared
            .as_mut()
            .and_then(|p| p.write().err())
            .map(|e| e.to_string());
        let buffers = prepared.as_ref().map(|p| send_buffers(p, cp.device()));
        cp.scatter(&mut buf, buffers.as_deref(), 0)?;
        drop(buffers);
        // Frees the send buffers for the pool's next sample.
        drop(prepared);
        let outcome = wire::unpack_into(&buf, Some(&room), &a.buffer.slots)
            .map_err(|(feature, e)| format!("feature `{feature}`: {e}"))
            .and_then(|(blocks, passthrough)| {
                let sample = LocalSample {
                    sample,
                    coord: self.mesh.cp_coord(),
                    layout: a.layout,
                    blocks,
                    passthrough,
                };
                local(sample).map_err(|e| e.to_string())
            });
        let status = match (unwritten, outcome) {
            (Some(message), _) => Status::Source {
                rank: cp.ranks()[0],
                sample: Some(sample),
                message,
            },
            (None, Ok(v)) => return Ok((Status::Ok, Some(v))),
            (None, Err(message)) => Status::Rank {
                rank: self.mesh.rank(),
                kind: None,
                message,
            },
        };
        Ok((status, None))
    }

    /// The buffer this rank receives `a` into. While a deferred source writes its
    /// blocks, the others fault a new one in (zeroing it), which the scatter would
    /// otherwise wait on.
    fn receive_buffer(&self, a: &Header, receiver: bool) -> Result<Tensor, DistError> {
        let failed = |e: tch::TchError| DistError::Protocol {
            message: format!("a {}-byte buffer: {e}", a.buffer.bytes),
        };
        let bytes = a.buffer.room_at() + a.buffer.expanded_bytes();
        let (mut buf, fresh) =
            buffer(self.recv.as_ref(), bytes, self.mesh.cp().device()).map_err(failed)?;
        if fresh && a.deferred && receiver {
            drop(buf.f_zero_().map_err(failed)?);
        }
        Ok(buf)
    }
}

/// The source's send buffers where the CP group's backend takes them: NCCL scatters
/// device memory, gloo takes the CPU buffers as they are.
fn send_buffers(p: &Prepared, device: Device) -> Vec<Tensor> {
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
}

/// The source's prepared sample and its status for the step's first vote (its failure
/// to prepare, or no sample given); other ranks have neither.
fn source_status(
    is_source: bool,
    rank: usize,
    source: Option<Source>,
) -> (Option<Prepared>, Status) {
    match (is_source, source) {
        (true, Some(Ok(p))) => (Some(p), Status::Ok),
        (true, failure) => {
            let (sample, message) = match failure {
                Some(Err(f)) => (f.sample, f.message),
                _ => (None, "no sample was given to the source rank".into()),
            };
            let status = Status::Source {
                rank,
                sample,
                message,
            };
            (None, status)
        }
        (false, _) => (None, Status::Ok),
    }
}

/// Agrees on a rank-local outcome outside a distribution step (e.g. after a model
/// step): every rank returns the first failure in rank order, or `Ok`.
pub fn agree_on(mesh: &Mesh, local: Result<(), String>) -> Result<(), DistError> {
    agree(
        mesh.world(),
        match local {
            Ok(()) => Status::Ok,
            Err(message) => Status::Rank {
                rank: mesh.rank(),
                kind: None,
                message,
            },
        },
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::{GroupOptions, Rendezvous};
    use featshard_spec::DeviceMesh;

    const SPEC: &str = "\
version: 1
module: t
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true}
features:
  x: {axes: [tokens], dtype: float32}
";

    fn plan() -> Arc<Plan> {
        Arc::new(featshard_spec::compile_str("t.yaml", SPEC).expect("spec").1)
    }

    /// The 1x2 CP mesh the tests run on.
    fn tile() -> featshard_spec::Mesh {
        featshard_spec::Mesh::new(&[1, 2]).expect("a 1x2 mesh")
    }

    /// A preparer for the 1x2 CP mesh, blocks written in the step.
    fn in_step() -> Preparer {
        Preparer::new(plan(), tile()).write(Write::InStep)
    }

    /// Runs one step on a 1x2 CP mesh of threads, `source` on rank 0.
    fn step(source: Prepared) -> Vec<Result<(), DistError>> {
        let mut source = Some(source);
        let ranks = Rendezvous::in_process(2, GroupOptions::default()).expect("store");
        let threads: Vec<_> = ranks
            .into_iter()
            .map(|rdv| {
                let mine = source.take();
                std::thread::spawn(move || {
                    let mesh = Mesh::new(&rdv, DeviceMesh { dp: 1, cp: tile() })?;
                    let d = Distributor::new(&mesh, plan());
                    d.step(mine.map(Ok)).map(|_| ())
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
    fn a_received_sample_kept_is_never_overwritten_by_the_next_step() {
        let plan = plan();
        let ranks = Rendezvous::in_process(2, GroupOptions::default()).expect("store");
        let threads: Vec<_> = ranks
            .into_iter()
            .map(|rdv| {
                let plan = Arc::clone(&plan);
                std::thread::spawn(move || -> Result<(), DistError> {
                    let mesh = Mesh::new(&rdv, DeviceMesh { dp: 1, cp: tile() })?;
                    let pool = BufferPool::new(1);
                    let d = Distributor::new(&mesh, plan).recv_pool(pool.clone());
                    let send = |values: &[f32]| {
                        let features = sample(values);
                        d.send(mesh.is_source().then_some((0, &features)))
                    };
                    let x = |s: &LocalSample| s.blocks["x"].tensor.shallow_clone();
                    let first = send(&[1., 2., 3.])?;
                    let kept = x(&first).copy();
                    // The first sample is held: the second arrives in new memory.
                    let second = send(&[4., 5., 6.])?;
                    assert!(x(&first).equal(&kept));
                    assert!(!x(&second).equal(&kept));
                    assert_eq!(pool.free(), 0);
                    // Once dropped, its buffer takes the next sample.
                    let ptr = x(&first).data_ptr();
                    drop(first);
                    assert_eq!(pool.free(), 1);
                    let third = send(&[7., 8., 9.])?;
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

    /// One step on a 1x2 CP mesh of threads, each rank with its own plan and options.
    fn step_with(ranks: [(Arc<Plan>, Options); 2]) -> Vec<Result<(), DistError>> {
        let rdvs = Rendezvous::in_process(2, GroupOptions::default()).expect("store");
        let threads: Vec<_> = rdvs
            .into_iter()
            .zip(ranks)
            .map(|(rdv, (plan, opts))| {
                std::thread::spawn(move || {
                    let mesh = Mesh::new(&rdv, DeviceMesh { dp: 1, cp: tile() })?;
                    let d = Distributor::new(&mesh, plan).options(opts);
                    let features = sample(&[1., 2., 3.]);
                    d.send(mesh.is_source().then_some((0, &features)))
                        .map(|_| ())
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank thread"))
            .collect()
    }

    #[test]
    fn ranks_that_disagree_on_the_spec_or_workflow_are_told_both_sides() {
        let other = Arc::new(
            featshard_spec::compile_str("t.yaml", &SPEC.replace("float32", "float64"))
                .expect("spec")
                .1,
        );
        let training = Options {
            workflow: Some("training".into()),
            ..Options::default()
        };
        for (ranks, what) in [
            (
                [(plan(), Options::default()), (other, Options::default())],
                "the spec (sha256)",
            ),
            (
                [(plan(), Options::default()), (plan(), training)],
                "the workflow",
            ),
        ] {
            for outcome in step_with(ranks) {
                match outcome {
                    Err(DistError::Disagree { message }) => {
                        assert!(
                            message.starts_with(&format!("ranks disagree on {what}: rank 0 has ")),
                            "{message}"
                        );
                        assert!(message.contains(", rank 1 has "), "{message}");
                    }
                    other => panic!("expected a disagreement on {what}, got {other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_deferred_source_writes_its_blocks_in_the_step() {
        let p = in_step()
            .prepare(7, &sample(&[1., 2., 3.]))
            .expect("prepare");
        assert!(step(p).iter().all(Result::is_ok));
    }

    #[test]
    fn a_source_that_fails_to_write_after_its_header_fails_the_step_everywhere() {
        let mut p = in_step()
            .prepare(7, &sample(&[1., 2., 3.]))
            .expect("prepare");
        // The header is sound, but the blocks cannot be written.
        p.break_pending();
        for outcome in step(p) {
            match outcome {
                Err(DistError::Source {
                    rank: 0,
                    sample: Some(7),
                    message,
                }) => assert_eq!(
                    message,
                    "feature `x`: the buffer layout has a slot for it; this sample has no such feature"
                ),
                other => panic!("expected the source's failure, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_source_that_cannot_prepare_announces_it_to_every_rank() {
        let ranks = Rendezvous::in_process(2, GroupOptions::default()).expect("store");
        let threads: Vec<_> = ranks
            .into_iter()
            .map(|rdv| {
                std::thread::spawn(move || {
                    let mesh = Mesh::new(&rdv, DeviceMesh { dp: 1, cp: tile() })?;
                    let wrong: Features =
                        [("x".to_owned(), Tensor::zeros([2, 2], tch::kind::FLOAT_CPU))].into();
                    Distributor::new(&mesh, plan())
                        .send(mesh.is_source().then_some((3, &wrong)))
                        .map(|_| ())
                })
            })
            .collect();
        for t in threads {
            match t.join().expect("rank thread") {
                Err(DistError::Source {
                    rank: 0,
                    sample: Some(3),
                    message,
                }) => {
                    assert!(message.contains("feature `x`"), "{message}");
                }
                other => panic!("expected the source's failure, got {other:?}"),
            }
        }
    }
}
