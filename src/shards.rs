//! `featshard shard`: per-rank safetensors files on disk, written by the byte executor
//! (`featshard-exec`) straight from the memory-mapped sample; no libtorch.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use featshard_exec::files::{sum_of_file, Mapped, Metadata};
use featshard_exec::shard_folder::{
    new_run_id, rank_file_name, rank_file_sizes, read_manifest, stamp_now, stamp_of,
    write_rank_files, MANIFEST,
};
use featshard_exec::{place, ExecError, Options, Placed};
use featshard_spec::plan::{FeaturePlan, Plan};
use featshard_spec::shards::{
    layout_digest, Encoding, FeatureEntry, FileSum, Incoming, Manifest, RankIdentity, SourceStamp,
    MANIFEST_VERSION, RANK_KEY,
};
use featshard_spec::Mesh;

use crate::commands::{load, Failure};
use crate::room;
use crate::staging::{self, StagingDir};

pub(crate) fn other(e: impl std::fmt::Display) -> Failure {
    Failure::Other(e.to_string())
}

/// How a run goes (one sample, or a dataset's samples): its jobs and the threads of each.
pub struct Run<'a> {
    /// The mesh sizes as given (checked against the spec's mesh when it is loaded).
    pub mesh: crate::commands::MeshArg,
    /// The workflow every sample is for (`None`: every feature of the spec).
    pub workflow: Option<&'a str>,
    /// Keys not in the spec carried along into every rank file.
    pub passthrough: &'a [String],
    /// Samples sharded at once.
    pub jobs: usize,
    /// Threads of each job.
    pub threads: usize,
    /// A sample's rank files at most this many times its bytes (`--max-growth`).
    pub max_growth: f64,
    /// How rank files store blocks with a compact form (`--encoding`).
    pub encoding: Encoding,
}

/// The metadata features of `workflow` that the sample file's header holds.
fn sample_metadata(
    plan: &Plan,
    sample: &Mapped,
    workflow: Option<&str>,
) -> Result<Metadata, Failure> {
    let wanted = plan.feature_names(workflow).map_err(other)?;
    let mut meta = sample.header().metadata.clone();
    meta.retain(|k, _| {
        wanted.contains(&k.as_str())
            && matches!(plan.features.get(k), Some(FeaturePlan::Metadata { .. }))
    });
    Ok(meta)
}

/// Without `--workflow` every feature of the spec is required; a missing one that only
/// some workflows have says so, and names them.
fn without_workflow(req: &Request, e: ExecError) -> Failure {
    let missing = match &e {
        ExecError::Missing { feature } => std::slice::from_ref(feature),
        ExecError::MissingMany { features } => features.as_slice(),
        _ => return other(e),
    };
    let with = |feature: &String| -> Vec<&str> {
        let ws = req
            .plan
            .workflows
            .iter()
            .filter(|(_, fs)| fs.contains(feature));
        ws.map(|(w, _)| w.as_str()).collect()
    };
    let some_only = missing
        .iter()
        .find(|f| with(f).len() < req.plan.workflows.len());
    match (req.workflow, some_only) {
        (None, Some(feature)) => other(format!(
            "{e}; without --workflow every feature of the spec is required, and `{feature}` is in workflow {:?} only: pass --workflow for the workflow this sample is for",
            with(feature)
        )),
        _ => other(e),
    }
}

/// What one sample is sharded with.
pub struct Request<'a> {
    /// The spec's plan.
    pub plan: &'a Plan,
    /// The CP mesh.
    pub mesh: Mesh,
    /// The workflow the sample is for (`None`: every feature of the spec).
    pub workflow: Option<&'a str>,
    /// Keys not in the spec carried along into every rank file.
    pub passthrough: &'a [String],
    /// Threads for value checks and block writes.
    pub threads: usize,
    /// Report each rank file on stderr.
    pub verbose: bool,
    /// Rank files at most this many times the sample's bytes (see [`room::check`]).
    pub max_growth: f64,
    /// How rank files store blocks with a compact form.
    pub encoding: Encoding,
}

impl<'a> Request<'a> {
    /// A request for `plan` with `run`'s settings; a mesh that is not the spec's is
    /// refused by name.
    pub fn new(plan: &'a Plan, run: &Run<'a>, verbose: bool) -> Result<Request<'a>, Failure> {
        Ok(Request {
            plan,
            mesh: run.mesh.sizes(plan)?,
            workflow: run.workflow,
            passthrough: run.passthrough,
            threads: run.threads,
            verbose,
            max_growth: run.max_growth,
            encoding: run.encoding,
        })
    }
}

/// Shards one serial sample file into `out/rank-<r>.safetensors` + `manifest.json`.
pub fn shard(spec: &Path, features: &Path, run: &Run, out: &Path) -> Result<String, Failure> {
    let (_, plan) = load(spec)?;
    staging::check_existing(out, true)?;
    if out.exists() && std::fs::read_dir(out).map_or(true, |mut d| d.next().is_some()) {
        return Err(other(format!(
            "{} already exists and is not empty; choose a new --out",
            out.display()
        )));
    }
    let req = Request::new(&plan, run, true)?;
    shard_sample(&req, features, out)?;
    Ok(format!(
        "wrote {} rank files ({}) and manifest.json to {}",
        req.mesh.ranks(),
        plan.mesh.named(req.mesh),
        out.display()
    ))
}

/// Shards one sample file into `out` (absent or empty): staged next to it, renamed into
/// place at the end, so a failure leaves nothing. Returns the bytes written.
pub fn shard_sample(req: &Request, features: &Path, out: &Path) -> Result<u64, Failure> {
    staging::check_existing(out, true)?;
    let mapped = Mapped::open(features).map_err(other)?;
    let sample = mapped.sample();
    let metadata = sample_metadata(req.plan, &mapped, req.workflow)?;
    let opts = Options {
        workflow: req.workflow.map(str::to_owned),
        passthrough: req.passthrough.iter().cloned().collect::<BTreeSet<_>>(),
        threads: req.threads,
    };
    let placed = place(req.plan, req.mesh, &sample, &opts).map_err(|e| without_workflow(req, e))?;
    // Dropped on any failure from here on: this run's staging folder goes with it.
    let staging = StagingDir::create(out)?;
    let input = mapped.header().data_end();
    let source = stamp_of(&mapped);
    let bytes = write_shards(req, &placed, &metadata, staging.path(), input, source)?;
    // What was validated must be what was written: the input unchanged throughout.
    mapped.check_unchanged(features).map_err(other)?;
    staging.finish(out)?;
    Ok(bytes)
}

fn write_shards(
    req: &Request,
    placed: &Placed,
    metadata: &Metadata,
    dir: &Path,
    input_bytes: u64,
    source: SourceStamp,
) -> Result<u64, Failure> {
    let plan = req.plan;
    let mesh = placed.layout.mesh;
    let world = mesh.ranks();
    let run = new_run_id(plan);
    let layout_sha256 = layout_digest(&placed.layout).map_err(other)?;
    let headers = (0..world)
        .map(|rank| {
            let identity = RankIdentity {
                run: run.clone(),
                rank,
                mesh: plan.mesh.named(mesh),
                layout_sha256: layout_sha256.clone(),
                encoding: req.encoding,
            };
            let mut header = metadata.clone();
            header.insert(
                RANK_KEY.into(),
                serde_json::to_string(&identity).map_err(other)?,
            );
            Ok(header)
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    let names: Vec<String> = (0..world).map(rank_file_name).collect();
    let paths: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
    let (layout, shapes) = (placed.layout.clone(), &placed.shapes);
    let intake = placed.intake.clone();
    let passthrough: Vec<String> = placed.passthrough.keys().cloned().collect();
    let sizes = rank_file_sizes(plan, placed, &headers, req.encoding).map_err(other)?;
    room::check(dir, sizes.iter().sum(), input_bytes, req.max_growth)?;
    let written = write_rank_files(plan, placed, &headers, &paths, req.threads, req.encoding)
        .map_err(other)?;
    if req.verbose {
        eprintln!(
            "{world} rank files written (mesh {})",
            plan.mesh.named(mesh)
        );
    }
    let sums: BTreeMap<String, FileSum> = names.into_iter().zip(written).collect();
    let features = shapes
        .iter()
        .map(|(n, s)| {
            let t = featshard_exec::tensor_plan(plan, n).map_err(other)?;
            Ok((n.clone(), FeatureEntry::new(t, s)))
        })
        .collect::<Result<_, Failure>>()?;
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        spec: plan.source.clone(),
        mesh: plan.mesh.named(mesh),
        encoding: req.encoding,
        workflow: req.workflow.map(str::to_owned),
        layout,
        features,
        passthrough,
        metadata: metadata.clone(),
        incoming: Incoming {
            dropped: intake.dropped,
            arrived: intake.arrived,
            unowned_rows: intake.unowned,
        },
        files: sums,
        run,
        source: Some(source),
    };
    featshard_exec::shard_folder::write_manifest(dir, &manifest).map_err(other)?;
    Ok(manifest.files.values().map(|f| f.bytes).sum())
}

/// Whether `dir` holds a finished sample of this plan, mesh and workflow, sharded from
/// `source` as it is now: its manifest reads, records the sample file's size,
/// modification time and header as they are, and every rank file has the size and
/// checksum it was written with.
pub fn verify(req: &Request, source: &Path, dir: &Path) -> Result<u64, String> {
    let (mesh, workflow) = (req.mesh, req.workflow);
    let m = read_manifest(req.plan, &dir.join(MANIFEST))?;
    if m.layout.mesh != mesh || m.workflow.as_deref() != workflow || m.encoding != req.encoding {
        return Err(format!(
            "sharded for mesh {}, workflow {:?}, encoding {}",
            m.mesh,
            m.workflow,
            m.encoding.name()
        ));
    }
    if m.source != Some(stamp_now(source)?) {
        return Err(format!(
            "{} changed since it was sharded (size, time or header)",
            source.display()
        ));
    }
    let world = mesh.ranks();
    // The manifest names only its own rank files, in its own folder: nothing else is
    // read on its say-so (an absolute path, `..`, a device).
    let own: BTreeSet<String> = (0..world).map(rank_file_name).collect();
    if m.files.keys().ne(own.iter()) {
        return Err(format!(
            "its files are not rank-0 to rank-{} of this folder",
            world.saturating_sub(1)
        ));
    }
    for (name, want) in &m.files {
        let got = sum_of_file(&dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
        if got != *want {
            return Err(format!(
                "{name} differs from what was written (size or checksum)"
            ));
        }
    }
    Ok(m.files.values().map(|f| f.bytes).sum())
}

/// Removes a sample's shard folder for a redo, when it holds only what `shard` writes
/// (`manifest.json` and `rank-<r>.safetensors`, regular files); a folder with anything
/// else in it, or a link, is the user's and is refused by name. Absent is fine.
pub fn remove_shard_folder(dir: &Path) -> Result<(), Failure> {
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return Ok(());
    };
    let refuse = |what: String| {
        other(format!(
            "{}: {what}; featshard removes only folders it wrote: move it away to redo this sample",
            dir.display()
        ))
    };
    if !meta.is_dir() {
        return Err(refuse("exists and is not a folder of shards".into()));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| refuse(e.to_string()))?;
    let mut own = Vec::new();
    let mut foreign = Vec::new();
    for e in entries {
        let e = e.map_err(|e| refuse(e.to_string()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let regular = e.file_type().is_ok_and(|t| t.is_file());
        if regular && is_shard_file_name(&name) {
            own.push(e.path());
        } else {
            foreign.push(name);
        }
    }
    if !foreign.is_empty() {
        foreign.sort();
        let shown: Vec<&str> = foreign.iter().take(5).map(String::as_str).collect();
        let more = foreign.len().saturating_sub(shown.len());
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        return Err(refuse(format!(
            "holds files featshard did not write ({}{tail})",
            shown.join(", ")
        )));
    }
    for path in own {
        std::fs::remove_file(&path).map_err(|e| refuse(e.to_string()))?;
    }
    std::fs::remove_dir(dir).map_err(|e| refuse(e.to_string()))
}

/// `manifest.json` or `rank-<r>.safetensors`.
fn is_shard_file_name(name: &str) -> bool {
    name == MANIFEST
        || name
            .strip_prefix("rank-")
            .and_then(|r| r.strip_suffix(".safetensors"))
            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
}
