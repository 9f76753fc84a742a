//! Benchmark: pad and produce all 9 ranks' blocks of a Boltz-2-sized sample on cp=(3,3).
//!
//! Run with `. scripts/env.sh && cargo bench -p featshard-runtime --bench shard_boltz`.
//! Prints bytes, time and GB/s of featshard, and of a plain tensor copy of the same
//! bytes measured in the same run (the memory-bandwidth bound), with their ratio (each
//! the median of 3 runs); and
//! the peak memory above the serial sample, against the padded bytes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use featshard_runtime::{pad, Options};
use featshard_spec::Plan;
use tch::{Kind, Tensor};

mod common;

use common::{MSA, TOKENS};

/// The CP tile the bench shards on.
fn mesh() -> featshard_spec::Mesh {
    featshard_spec::Mesh::new(&[3, 3]).expect("a 3x3 mesh")
}
const RUNS: usize = 3;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn bytes(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}

/// Peak resident memory since the last reset, in bytes (Linux).
fn peak_rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn reset_peak_rss() {
    // "5" resets the peak resident set size (Linux >= 4.0).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn gb(b: usize) -> f64 {
    b as f64 / 1e9
}

fn main() {
    tch::set_num_threads(1);
    let plan = common::boltz2_plan();
    let counts = common::atom_counts();
    let sample = common::boltz2_sample(&plan);
    let serial_bytes: usize = sample.values().map(bytes).sum();
    println!(
        "sample: {} tokens, {} atoms, {} MSA rows, {} features, {:.2} GB serial; mesh {}x{}; 1 thread",
        TOKENS,
        counts.iter().sum::<usize>(),
        MSA,
        sample.len(),
        gb(serial_bytes),
        mesh().size(0),
        mesh().size(1)
    );
    let opts = Options {
        workflow: Some("inference".into()),
        ..Options::default()
    };
    reset_peak_rss();
    let base_rss = peak_rss();
    let ours = featshard_run(&plan, &sample, &opts, base_rss);
    let base = Baselines::measure(&sample, ours.padded_bytes, ours.copied_bytes);
    report(&ours, &base, serial_bytes);
}

/// What featshard's run measured: times, bytes and peak memory.
struct Ours {
    t_views: Duration,
    t_materialise: Duration,
    padded_bytes: usize,
    block_bytes: usize,
    copied_bytes: usize,
    peak_views: usize,
    peak_all: usize,
}

/// featshard: validate, pad once, then every rank's block (views of the padded
/// tensors). Then, separately, the blocks that are not contiguous views are
/// materialised, as a scatter must send them.
fn featshard_run(
    plan: &Plan,
    sample: &BTreeMap<String, Tensor>,
    opts: &Options,
    base_rss: usize,
) -> Ours {
    // A pipeline shards sample after sample, so each step is timed over RUNS runs and
    // the median is reported (the first run also pays for the process's first page
    // faults); peak memory is read on the first run.
    let mut peak_views = 0;
    let mut times = Vec::new();
    for run in 0..RUNS {
        let start = Instant::now();
        let padded = pad(plan, mesh(), sample, opts).expect("pad");
        let ranks: Vec<_> = (0..mesh().ranks())
            .map(|r| padded.rank_blocks(plan, r).expect("blocks"))
            .collect();
        times.push(start.elapsed());
        if run == 0 {
            peak_views = peak_rss().saturating_sub(base_rss);
        }
        drop(ranks);
    }
    let padded = pad(plan, mesh(), sample, opts).expect("pad");
    let ranks: Vec<_> = (0..mesh().ranks())
        .map(|r| padded.rank_blocks(plan, r).expect("blocks"))
        .collect();
    let block_bytes: usize = ranks
        .iter()
        .flat_map(|r| r.values())
        .map(|b| bytes(&b.tensor))
        .sum();
    let start = Instant::now();
    let mut copied_bytes = 0;
    let materialised: Vec<BTreeMap<String, Tensor>> = ranks
        .iter()
        .map(|r| {
            r.iter()
                .map(|(n, b)| {
                    if !b.tensor.is_contiguous() {
                        copied_bytes += bytes(&b.tensor);
                    }
                    (n.clone(), b.tensor.contiguous())
                })
                .collect()
        })
        .collect();
    let t_materialise = start.elapsed();
    let peak_all = peak_rss().saturating_sub(base_rss);
    drop(materialised);
    Ours {
        t_views: median(times),
        t_materialise,
        padded_bytes: padded.tensors.values().map(bytes).sum(),
        block_bytes,
        copied_bytes,
        peak_views,
        peak_all,
    }
}

/// Baselines, in the same run: the same bytes through one plain tensor copy into new
/// memory (allocated as producing blocks must), into memory that is already faulted in
/// (the pure bandwidth bound), and feature by feature (as padding allocates them).
struct Baselines {
    new: Duration,
    warm: Duration,
    features: Duration,
    materialise_new: Duration,
    materialise_warm: Duration,
}

impl Baselines {
    fn measure(sample: &BTreeMap<String, Tensor>, padded: usize, copied: usize) -> Self {
        let runs = |f: &dyn Fn() -> Duration| median((0..RUNS).map(|_| f()).collect());
        let features = runs(&|| {
            let start = Instant::now();
            let copies: Vec<Tensor> = sample
                .values()
                .map(|x| {
                    let mut y = x.empty_like();
                    y.copy_(x);
                    y
                })
                .collect();
            let t = start.elapsed();
            drop(copies);
            t
        });
        Baselines {
            new: runs(&|| copy_new(padded)),
            warm: runs(&|| copy_warm(padded)),
            features,
            materialise_new: runs(&|| copy_new(copied)),
            materialise_warm: runs(&|| copy_warm(copied)),
        }
    }
}

fn copy_new(n: usize) -> Duration {
    let src = Tensor::ones([(n / 4) as i64], (Kind::Float, tch::Device::Cpu));
    let start = Instant::now();
    let mut dst = Tensor::empty([(n / 4) as i64], (Kind::Float, tch::Device::Cpu));
    dst.copy_(&src);
    let t = start.elapsed();
    drop(dst);
    t
}

fn copy_warm(n: usize) -> Duration {
    let src = Tensor::ones([(n / 4) as i64], (Kind::Float, tch::Device::Cpu));
    let mut dst = Tensor::zeros([(n / 4) as i64], (Kind::Float, tch::Device::Cpu));
    let start = Instant::now();
    dst.copy_(&src);
    start.elapsed()
}

fn report(o: &Ours, b: &Baselines, serial_bytes: usize) {
    let rate = |bytes: usize, t: Duration| gb(bytes) / t.as_secs_f64();
    let ratio = |base: Duration, ours: Duration| base.as_secs_f64() / ours.as_secs_f64();
    println!(
        "padded bytes                       {:>7.3} GB",
        gb(o.padded_bytes)
    );
    println!(
        "bytes of all 9 ranks' blocks       {:>7.3} GB (views of the padded tensors)",
        gb(o.block_bytes)
    );
    println!(
        "pad + 9 ranks' blocks              {:>7.3} s  {:>6.2} GB/s  ratio to copy into new memory {:.2}, to warm copy {:.2}",
        o.t_views.as_secs_f64(),
        rate(o.padded_bytes, o.t_views),
        ratio(b.new, o.t_views),
        ratio(b.warm, o.t_views)
    );
    println!(
        "  plain copy, new memory           {:>7.3} s  {:>6.2} GB/s",
        b.new.as_secs_f64(),
        rate(o.padded_bytes, b.new)
    );
    println!(
        "  plain copy, warm memory          {:>7.3} s  {:>6.2} GB/s",
        b.warm.as_secs_f64(),
        rate(o.padded_bytes, b.warm)
    );
    println!(
        "  plain copy, feature by feature   {:>7.3} s  {:>6.2} GB/s  (serial bytes; featshard ratio {:.2})",
        b.features.as_secs_f64(),
        rate(serial_bytes, b.features),
        ratio(b.features, o.t_views)
    );
    println!(
        "materialise non-contiguous blocks  {:>7.3} s  {:>6.2} GB/s  ({:.3} GB) ratio to copy into new memory {:.2}, to warm copy {:.2}",
        o.t_materialise.as_secs_f64(),
        rate(o.copied_bytes, o.t_materialise),
        gb(o.copied_bytes),
        ratio(b.materialise_new, o.t_materialise),
        ratio(b.materialise_warm, o.t_materialise)
    );
    println!(
        "peak memory above the serial sample: {:.3} GB = {:.2} x padded bytes with views (goal <= 1.2); {:.2} x once materialised",
        gb(o.peak_views),
        o.peak_views as f64 / o.padded_bytes as f64,
        o.peak_all as f64 / o.padded_bytes as f64
    );
}
