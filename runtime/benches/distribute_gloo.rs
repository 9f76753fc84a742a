//! Benchmark: distributing a Boltz-2-sized sample (N=2048) over cp=(3,3) through gloo,
//! against a raw gloo scatter of the same bytes in the same run.
//!
//! Run with `. scripts/env.sh && cargo bench -p featshard-runtime --bench distribute_gloo`.
//! Nine gloo ranks, one thread each, in this process (a HashStore rendezvous; the
//! transport is TCP over loopback as between processes). Each figure is the median of
//! RUNS runs, timed on the source rank from a barrier to a barrier, with the raw
//! scatter and featshard runs interleaved so that machine noise hits both alike:
//! - raw scatter: the source already holds every rank's bytes; one scatter into a new
//!   receive buffer on each rank (what code that hands the received tensors on does),
//!   and into a receive buffer reused from the previous run (no page faults).
//! - distribute, sample prepared: header broadcast + the same scatter + the world's
//!   status agreement + unpacking into typed views (what a prefetching loader pays
//!   per step once the next sample is prepared in the background). Every rank
//!   receives into its buffer pool, as the loader does: the previous sample was
//!   dropped, so its buffer is reused.
//! - prepare: the source alone validates the serial sample, places it and writes every
//!   rank's block straight into its send buffer (reused from sample to sample, as the
//!   loader does), with 1 and with 2 threads.
//! - distribute from the serial sample: validate and place it, then the step above with
//!   the source writing the blocks on 2 threads once the header is out
//!   (`Write::InStep`); into pooled receive buffers, and into new ones (which the
//!   other ranks fault in while the source writes).
//! - loader, 4 samples: the sharded loader (prefetch 1, 2 threads) against 4 raw
//!   scatters into new buffers, for two epochs: the first touches its buffers for the
//!   first time, the second reuses them.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use featshard_runtime::dist::{
    BufferPool, Distributor, GroupOptions, LoaderOptions, Mesh, Prepared, Preparer, Rendezvous,
    SerialDataset, ShardedLoader, Write,
};
use featshard_runtime::{Features, Options};
use tch::{Device, Kind, Tensor};

/// The CP tile the bench distributes over.
fn cp() -> featshard_spec::Mesh {
    featshard_spec::Mesh::new(&[3, 3]).expect("a 3x3 mesh")
}
const RUNS: usize = 5;
const LOADER_SAMPLES: usize = 4;

/// The one sample, handed out again and again.
struct Repeat(Mutex<Features>);

impl SerialDataset for Repeat {
    fn len(&self) -> usize {
        LOADER_SAMPLES
    }

    fn get(&self, _: usize) -> Result<Features, String> {
        let f = self.0.lock().map_err(|e| e.to_string())?;
        Ok(f.iter()
            .map(|(k, v)| (k.clone(), v.shallow_clone()))
            .collect())
    }
}

#[derive(Default, Debug)]
struct Times {
    raw: Vec<Duration>,
    /// The raw scatter into a receive buffer reused from run to run.
    raw_reused: Vec<Duration>,
    prepared: Vec<Duration>,
    /// By threads writing the rank buffers (1, 2).
    prepare: [Vec<Duration>; 2],
    serial: Vec<Duration>,
    /// From the serial sample, into new receive buffers.
    serial_new: Vec<Duration>,
    /// From the serial sample with every block dense (no compact one-hot or masks).
    serial_dense: Vec<Duration>,
    raw_loader: Vec<Duration>,
    loader: Vec<Duration>,
    bytes_per_rank: usize,
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64()
}

fn main() {
    tch::set_num_threads(1);
    let plan = Arc::new(common::boltz2_plan());
    let sample = common::boltz2_sample(&plan);
    let opts = Options {
        workflow: Some("inference".into()),
        ..Options::default()
    };
    let serial_bytes: usize = sample
        .values()
        .map(|t| t.numel() * t.kind().elt_size_in_bytes())
        .sum();
    let dataset = Arc::new(Repeat(Mutex::new(sample)));
    let world = cp().ranks();
    let gopts = GroupOptions {
        timeout: Duration::from_secs(600),
        ..GroupOptions::default()
    };
    let handles: Vec<_> = Rendezvous::in_process(world, gopts)
        .expect("hash store")
        .into_iter()
        .map(|rdv| {
            let (plan, opts, dataset) = (Arc::clone(&plan), opts.clone(), Arc::clone(&dataset));
            thread::spawn(move || -> Option<Times> {
                tch::set_num_threads(1);
                let mesh =
                    Mesh::new(&rdv, featshard_spec::DeviceMesh { dp: 1, cp: cp() }).expect("mesh");
                let mut rank = Rank::new(mesh, plan, opts, dataset);
                let mut times = rank.steps();
                rank.loader(&mut times);
                rank.mesh.is_source().then_some(times)
            })
        })
        .collect();
    let times = handles
        .into_iter()
        .filter_map(|h| h.join().expect("rank"))
        .next()
        .expect("the source's times");
    report(&times, serial_bytes);
}

/// One gloo rank's side of the benchmark.
struct Rank {
    mesh: Mesh,
    plan: Arc<featshard_spec::Plan>,
    opts: Options,
    dataset: Arc<Repeat>,
    /// The source's send buffers, reused from sample to sample as the loader does.
    pool: BufferPool,
    /// This rank's receive buffer, reused likewise; let go before the loader runs,
    /// which keeps its own.
    recv: Option<BufferPool>,
    /// The raw scatter's bytes per rank: as many as each rank's featshard buffer.
    per_rank: usize,
}

impl Rank {
    fn new(
        mesh: Mesh,
        plan: Arc<featshard_spec::Plan>,
        opts: Options,
        dataset: Arc<Repeat>,
    ) -> Self {
        let world = cp().ranks();
        let mut rank = Rank {
            mesh,
            plan,
            opts,
            dataset,
            pool: BufferPool::new(world),
            recv: Some(BufferPool::new(1)),
            per_rank: 0,
        };
        let probe = rank.mesh.is_source().then(|| rank.prepare(1));
        let local = rank.step(probe, true);
        rank.per_rank = local
            .blocks
            .values()
            .map(|b| {
                let n = b.tensor.numel() * b.tensor.kind().elt_size_in_bytes();
                n.div_ceil(16) * 16
            })
            .sum();
        rank
    }

    fn sync(&self) {
        self.mesh.world().barrier().expect("barrier");
    }

    fn with_threads(&self, threads: usize) -> Options {
        Options {
            threads,
            ..self.opts.clone()
        }
    }

    fn preparer(&self, threads: usize, write: Write) -> Preparer {
        Preparer::new(Arc::clone(&self.plan), cp())
            .options(self.with_threads(threads))
            .pool(self.pool.clone())
            .write(write)
    }

    /// The source alone: the sample validated, placed and written into send buffers.
    fn prepare(&self, threads: usize) -> Prepared {
        let s = self.dataset.get(0).expect("sample");
        self.preparer(threads, Write::Now)
            .prepare(0, &s)
            .expect("prepare")
    }

    /// The source's blocks written once the header is out, compact or dense.
    fn deferred(&self, threads: usize, compact: bool) -> Option<Prepared> {
        self.mesh.is_source().then(|| {
            let s = self.dataset.get(0).expect("sample");
            let p = self.preparer(threads, Write::InStep).compact(compact);
            p.prepare(0, &s).expect("prepare")
        })
    }

    fn step(&self, ready: Option<Prepared>, pooled: bool) -> featshard_runtime::dist::LocalSample {
        let mut d = Distributor::new(&self.mesh, Arc::clone(&self.plan));
        if let Some(recv) = self.recv.as_ref().filter(|_| pooled) {
            d = d.recv_pool(recv.clone());
        }
        d.step(ready.map(Ok)).expect("distribute")
    }

    fn timed(&self, ready: Option<Prepared>, pooled: bool) -> Duration {
        self.sync();
        let start = Instant::now();
        let local = self.step(ready, pooled);
        self.sync();
        let t = start.elapsed();
        drop(local);
        t
    }

    /// The raw scatter sends from the source's send buffers: the same memory as
    /// featshard's steps, free between steps.
    fn raw_inputs(&self) -> Option<Vec<Tensor>> {
        self.mesh.is_source().then(|| {
            (0..cp().ranks())
                .map(|_| {
                    self.pool
                        .take(self.per_rank, Device::Cpu)
                        .expect("send buffer")
                })
                .collect()
        })
    }

    /// `n` raw scatters, each into a new tensor, as code that hands the received
    /// tensors on does.
    fn raw(&self, n: usize) -> Duration {
        self.scatters(n, || {
            Tensor::empty([self.per_rank as i64], (Kind::Uint8, Device::Cpu))
        })
    }

    /// One raw scatter into the receive buffer `distribute` reuses.
    fn raw_reused(&self) -> Duration {
        let recv = self
            .recv
            .as_ref()
            .expect("the receive pool, before the loader");
        self.scatters(1, || {
            recv.take(self.per_rank, Device::Cpu)
                .expect("receive buffer")
        })
    }

    /// `n` raw scatters from the send buffers, barrier to barrier, each into `out()`.
    fn scatters(&self, n: usize, out: impl Fn() -> Tensor) -> Duration {
        let inputs = self.raw_inputs();
        self.sync();
        let start = Instant::now();
        for _ in 0..n {
            self.mesh
                .cp()
                .scatter(&mut out(), inputs.as_deref(), 0)
                .expect("scatter");
        }
        self.sync();
        start.elapsed()
    }

    /// RUNS of every step, interleaved with the raw scatters.
    fn steps(&self) -> Times {
        let source = self.mesh.is_source();
        let mut times = Times {
            bytes_per_rank: self.per_rank,
            ..Times::default()
        };
        // The first transfer of a run is several times slower (connections,
        // allocator): one untimed.
        self.raw(1);
        for _ in 0..RUNS {
            times.raw.push(self.raw(1));
            times.raw_reused.push(self.raw_reused());
            // Prepared beforehand, as a prefetching loader has it.
            let ready = source.then(|| self.prepare(1));
            times.prepared.push(self.timed(ready, true));
            for (k, threads) in [1, 2].into_iter().enumerate() {
                if source {
                    let start = Instant::now();
                    drop(self.prepare(threads));
                    times.prepare[k].push(start.elapsed());
                }
            }
            times.serial.push(self.timed(self.deferred(2, true), true));
            times
                .serial_new
                .push(self.timed(self.deferred(2, true), false));
            times
                .serial_dense
                .push(self.timed(self.deferred(2, false), true));
        }
        times
    }

    /// Two epochs of the sharded loader against raw scatters of as many samples. The
    /// loader keeps its own buffers (the raw scatters still send from `pool`).
    fn loader(&mut self, times: &mut Times) {
        self.recv = None;
        let loader = ShardedLoader::new(
            Arc::clone(&self.dataset),
            Arc::clone(&self.plan),
            LoaderOptions {
                sample: self.with_threads(2),
                prefetch: 1,
                ..LoaderOptions::default()
            },
        )
        .expect("loader");
        for epoch in 0..2 {
            times.raw_loader.push(self.raw(LOADER_SAMPLES));
            self.sync();
            let start = Instant::now();
            for s in loader.samples(&self.mesh, epoch) {
                drop(s.expect("sample"));
            }
            self.sync();
            times.loader.push(start.elapsed());
        }
    }
}

fn report(times: &Times, serial_bytes: usize) {
    let world = cp().ranks();
    let gb = |b: usize| b as f64 / 1e9;
    let scattered = times.bytes_per_rank * world;
    println!(
        "sample: {} tokens, {} MSA rows, {:.2} GB serial; cp=({}, {}), 9 gloo ranks (threads, loopback TCP)",
        common::TOKENS,
        common::MSA,
        gb(serial_bytes),
        cp().size(0),
        cp().size(1)
    );
    println!(
        "bytes scattered per sample         {:>7.3} GB ({:.3} GB per rank)",
        gb(scattered),
        gb(times.bytes_per_rank)
    );
    // Medians, their ratios to the two raw scatters, and each run's ratio to the raw
    // scatter (new buffer) of the same run, which shows the machine's noise.
    let (raw_new, raw_reused) = (median(times.raw.clone()), median(times.raw_reused.clone()));
    println!(
        "{:<37}{:>9}  {:>9}  {:>5}  {:>6}  runs / raw",
        "", "median", "", "/raw", "/reused"
    );
    let line = |what: &str, runs: &[Duration]| {
        let t = median(runs.to_vec());
        let ratios: Vec<String> = runs
            .iter()
            .zip(&times.raw)
            .map(|(r, raw)| format!("{:.2}", r.as_secs_f64() / raw.as_secs_f64()))
            .collect();
        println!(
            "{what:<37}{t:>7.3} s  {:>5.2} GB/s  {:>5.2}  {:>6.2}   {}",
            gb(scattered) / t,
            t / raw_new,
            t / raw_reused,
            ratios.join(" ")
        );
    };
    line("raw gloo scatter", &times.raw);
    line("raw scatter, receive buffer reused", &times.raw_reused);
    line("distribute, sample prepared", &times.prepared);
    for (k, threads) in ["1 thread", "2 threads"].into_iter().enumerate() {
        line(&format!("prepare alone, {threads}"), &times.prepare[k]);
    }
    line("distribute from serial, 2 threads", &times.serial);
    line("  the same, new receive buffers", &times.serial_new);
    line("  the same, every block dense", &times.serial_dense);
    // Epoch 0 touches the loader's buffers for the first time; epoch 1 reuses them.
    for (epoch, (raw4, loader)) in times.raw_loader.iter().zip(&times.loader).enumerate() {
        let (raw4, loader) = (raw4.as_secs_f64(), loader.as_secs_f64());
        println!(
            "{:<37}{raw4:>7.3} s",
            format!("raw gloo scatter x {LOADER_SAMPLES}")
        );
        println!(
            "{:<37}{loader:>7.3} s  ratio to raw scatters {:.2}",
            format!("loader epoch {epoch}, {LOADER_SAMPLES} samples"),
            loader / raw4
        );
    }
}
