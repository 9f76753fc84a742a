//! The ranks of `distribute_boltz` (see `main.rs`): a module of its own so that the
//! multi-process test runs the same code in its workers.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use featshard_runtime::dist::{
    agree_on, collate, DistError, GroupOptions, LoaderOptions, LocalSample, Mesh, Order,
    Rendezvous, SerialDataset, ShardedLoader,
};
use featshard_runtime::synthetic::{self, Shape};
use featshard_runtime::{assemble, pad, unpad, Features, Options};
use featshard_spec::ir::{Placement, Role};
use featshard_spec::plan::{FeaturePlan, Plan};
use tch::Tensor;

#[derive(Parser, Debug, Clone)]
#[command(about = "Distribute Boltz-shaped samples through gloo and check every rank's blocks")]
pub struct Args {
    /// The featshard spec.
    #[arg(long)]
    pub spec: String,
    /// CP0xCP1 or DPxCP0xCP1; its product must be the world size.
    #[arg(long, default_value = "3x3")]
    pub mesh: String,
    #[arg(long, default_value = "inference")]
    pub workflow: String,
    /// Samples in the dataset.
    #[arg(long, default_value_t = 4)]
    pub samples: usize,
    /// Tokens of sample 0; sample i has `tokens + 3 i` (lengths differ per sample).
    #[arg(long, default_value_t = 20)]
    pub tokens: usize,
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Shuffle with this seed (training order); dataset order without it.
    #[arg(long)]
    pub shuffle: Option<u64>,
    /// A failing sample is replaced by the next one at most this many times.
    #[arg(long, default_value_t = 0)]
    pub retries: usize,
    /// Collective and rendezvous timeout, seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Skip the checks (only distribute): for timing.
    #[arg(long)]
    pub no_check: bool,
    /// The dataset fails to read this sample (a source-rank failure).
    #[arg(long)]
    pub fail_sample: Option<usize>,
    /// With --fail-step: this rank fails its local step (a non-source failure).
    #[arg(long)]
    pub fail_rank: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub fail_step: usize,
    /// With --fail-step: this rank's process exits without a word.
    #[arg(long)]
    pub crash_rank: Option<usize>,
}

/// Boltz-shaped serial samples, made from their index.
pub struct BoltzSamples {
    plan: Arc<Plan>,
    workflow: String,
    tokens: usize,
    len: usize,
    fail: Option<usize>,
}

/// torch's generator is process-global: one sample is drawn at a time.
static DRAW: Mutex<()> = Mutex::new(());

impl BoltzSamples {
    fn shape(&self, index: usize) -> Shape {
        let n = self.tokens + 3 * index;
        // 0..=11 atoms per token, a few tokens without atoms.
        let counts: Vec<usize> = (0..n).map(|t| (t * 7 + index) % 12).collect();
        Shape::boltz(counts, 5, None)
    }

    pub fn serial(&self, index: usize) -> Result<Features, String> {
        let _guard = DRAW.lock().unwrap_or_else(|p| p.into_inner());
        synthetic::sample(
            &self.plan,
            Some(&self.workflow),
            &self.shape(index),
            index as i64,
        )
        .map_err(|e| e.to_string())
    }
}

impl SerialDataset for BoltzSamples {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Features, String> {
        if self.fail == Some(index) {
            return Err(format!(
                "sample {index}: cannot read its features (injected failure)"
            ));
        }
        self.serial(index)
    }
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    a.size() == b.size() && a.kind() == b.kind() && a.equal(b)
}

/// Every check of one received sample on this rank; the first failure, named.
fn check(
    mesh: &Mesh,
    plan: &Plan,
    data: &BoltzSamples,
    opts: &Options,
    local: &LocalSample,
) -> Result<(), String> {
    let emitted = data.serial(local.sample)?;
    let padded = pad(plan, mesh.cp_shape(), &emitted, opts).map_err(|e| e.to_string())?;
    // The sample the plan lays out: its derived features made.
    let serial = featshard_runtime::intake(plan, &emitted, opts)
        .map_err(|e| e.to_string())?
        .features;
    let expected = padded
        .rank_blocks(plan, mesh.cp_rank())
        .map_err(|e| e.to_string())?;
    check_blocks(mesh, &expected, local)?;
    check_masks(mesh, plan, &serial, local)?;
    check_assembles(mesh, plan, data, &serial, local)
}

/// The received blocks are the runtime's, with its metadata, and sharded ones are parts.
fn check_blocks(
    mesh: &Mesh,
    expected: &std::collections::BTreeMap<String, featshard_runtime::LocalBlock>,
    local: &LocalSample,
) -> Result<(), String> {
    if expected.keys().ne(local.blocks.keys()) {
        return Err("received features differ from the plan's".into());
    }
    let mut sharded = 0;
    for (name, want) in expected {
        let got = &local.blocks[name];
        if !same(&got.tensor, &want.tensor) {
            return Err(format!(
                "feature `{name}`: the received block differs from the runtime's block"
            ));
        }
        if got.meta != want.meta {
            return Err(format!(
                "feature `{name}`: DTensor metadata {:?}, expected {:?}",
                got.meta, want.meta
            ));
        }
        // Split over a mesh axis of more than one rank: this rank holds a part only.
        let split = got
            .meta
            .placements
            .iter()
            .zip(mesh.cp_shape().sizes())
            .any(|(p, &n)| matches!(p, Placement::Shard(_)) && n > 1);
        if split {
            sharded += 1;
            let global: usize = got.meta.global_shape.iter().product();
            if got.tensor.numel() >= global && global > 0 {
                return Err(format!(
                    "feature `{name}`: sharded, yet this rank holds all {global} elements"
                ));
            }
        }
    }
    if mesh.cp().size() > 1 && sharded == 0 {
        return Err("no feature is sharded".into());
    }
    Ok(())
}

/// Every pad position of a mask feature is false: the CP group's true entries are the
/// serial mask's, once per replica.
fn check_masks(
    mesh: &Mesh,
    plan: &Plan,
    serial: &Features,
    local: &LocalSample,
) -> Result<(), String> {
    for (name, f) in &plan.features {
        let (FeaturePlan::Tensor(t), Some(b)) = (f, local.blocks.get(name)) else {
            continue;
        };
        if matches!(t.role, Role::Mask { .. }) {
            let serial_true = serial[name].ne(0).sum(tch::Kind::Int64).int64_value(&[]);
            let mut total = b.tensor.ne(0).sum(tch::Kind::Int64);
            let group = mesh.cp();
            group
                .all_reduce(&mut total, featshard_runtime::dist::ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            // Replicated axes count each true entry once per replica of the block.
            let replicas = replicas(&b.meta.placements, mesh.cp_shape());
            if total.int64_value(&[]) != serial_true * replicas as i64 {
                return Err(format!(
                    "mask `{name}`: {} true entries over the CP group, the serial mask has {serial_true} (x{replicas} replicas)",
                    total.int64_value(&[])
                ));
            }
        }
    }
    Ok(())
}

/// Every rank's blocks gathered and assembled give the serial sample back.
fn check_assembles(
    mesh: &Mesh,
    plan: &Plan,
    data: &BoltzSamples,
    serial: &Features,
    local: &LocalSample,
) -> Result<(), String> {
    let mut ranks: Vec<Features> = (0..mesh.cp().size()).map(|_| Features::new()).collect();
    for (name, b) in &local.blocks {
        let parts = mesh
            .cp()
            .all_gather(&b.tensor.contiguous())
            .map_err(|e| e.to_string())?;
        for (r, t) in parts.into_iter().enumerate() {
            ranks[r].insert(name.clone(), t);
        }
    }
    let full =
        assemble(plan, &local.layout, Some(&data.workflow), &ranks).map_err(|e| e.to_string())?;
    let back = unpad(plan, &local.layout, &full).map_err(|e| e.to_string())?;
    for (name, x) in serial {
        match back.get(name) {
            Some(y) if same(x, y) => {}
            _ => {
                return Err(format!(
                    "feature `{name}`: assembled blocks differ from the serial sample"
                ))
            }
        }
    }
    Ok(())
}

/// Collating one sample gives a batch axis of the DP size.
fn check_collate(mesh: &Mesh, plan: &Plan, local: LocalSample) -> Result<(), DistError> {
    let batch = collate(mesh, plan, vec![local])?;
    let meta = &batch.blocks.values().next().map(|b| b.meta.clone());
    if let Some(m) = meta {
        if m.global_shape.first() != Some(&mesh.dp_size()) {
            return Err(DistError::Protocol {
                message: format!(
                    "collate: batch axis {:?}, expected {}",
                    m.global_shape.first(),
                    mesh.dp_size()
                ),
            });
        }
    }
    Ok(())
}

/// How many CP ranks hold each element of a tensor with these placements.
fn replicas(placements: &[Placement], cp: featshard_spec::Mesh) -> usize {
    placements
        .iter()
        .zip(cp.sizes())
        .filter(|(p, _)| matches!(p, Placement::Replicate))
        .map(|(_, &n)| n)
        .product()
}

/// Runs one rank; returns its summary line, or the error every rank agreed on.
/// `step_start` is when the current step began (to time how fast failures spread).
pub fn run(args: &Args, step_start: &mut Instant) -> Result<String, DistError> {
    let setup = |message: String| DistError::Setup { message };
    let (_, plan) =
        featshard_spec::compile_file(args.spec.as_ref()).map_err(|d| setup(d.render_plain()))?;
    let plan = Arc::new(plan);
    let shape = plan.mesh.parse(&args.mesh).map_err(setup)?;
    let rdv = Rendezvous::from_env(GroupOptions {
        timeout: Duration::from_secs(args.timeout),
        ..GroupOptions::default()
    })?;
    let mesh = Mesh::new(&rdv, shape)?;
    let data = Arc::new(BoltzSamples {
        plan: Arc::clone(&plan),
        workflow: args.workflow.clone(),
        tokens: args.tokens,
        len: args.samples,
        fail: args.fail_sample,
    });
    let sample_opts = Options {
        workflow: Some(args.workflow.clone()),
        // The source checks features and writes rank buffers on two threads.
        threads: 2,
        ..Options::default()
    };
    let loader = ShardedLoader::new(
        Arc::clone(&data),
        Arc::clone(&plan),
        LoaderOptions {
            order: args
                .shuffle
                .map_or(Order::Sequential, |seed| Order::Shuffled { seed }),
            retries: args.retries,
            sample: sample_opts.clone(),
            ..LoaderOptions::default()
        },
    )?;
    let start = Instant::now();
    let mut seen = Vec::new();
    let mut bytes = 0usize;
    let mut step = 0;
    for epoch in 0..args.epochs {
        let mut samples = loader.samples(&mesh, epoch);
        loop {
            *step_start = Instant::now();
            let Some(local) = samples.next() else { break };
            step += 1;
            if args.crash_rank == Some(mesh.rank()) && step == args.fail_step {
                std::process::exit(3);
            }
            let local = local?;
            seen.push(local.sample);
            bytes += local
                .blocks
                .values()
                .map(|b| b.tensor.numel() * b.tensor.kind().elt_size_in_bytes())
                .sum::<usize>();
            let mut outcome = if args.no_check {
                Ok(())
            } else {
                check(&mesh, &plan, &data, &sample_opts, &local)
            };
            if args.fail_rank == Some(mesh.rank()) && step == args.fail_step {
                outcome = Err(format!("injected failure in step {step}"));
            }
            // Every rank learns of any rank's failure here.
            agree_on(&mesh, outcome)?;
            if !args.no_check {
                check_collate(&mesh, &plan, local)?;
            }
        }
    }
    Ok(format!(
        "rank={} dp={} cp={} ok samples={seen:?} local_bytes={bytes} seconds={:.3}",
        mesh.rank(),
        mesh.dp_index(),
        mesh.cp_coord(),
        start.elapsed().as_secs_f64()
    ))
}

/// Prints the rank's summary (or its error) and maps it to the exit code.
pub fn main_with(args: &Args) -> ExitCode {
    let rank = std::env::var("RANK").unwrap_or_else(|_| "?".into());
    let mut step_start = Instant::now();
    match run(args, &mut step_start) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!(
                "rank={rank} error step_seconds={:.3}: {e}",
                step_start.elapsed().as_secs_f64()
            );
            ExitCode::FAILURE
        }
    }
}
