//! `featshard shard`: per-rank safetensors files on disk, written by the byte executor
//! (`featshard-exec`) straight from the memory-mapped sample; no libtorch.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use featshard_exec::files::{Mapped, Metadata};
use featshard_exec::rank_files::write_rank_files;
use featshard_exec::{place, Options, Placed, RuntimeError};
use featshard_spec::layout::contiguous_stride;
use featshard_spec::plan::{FeaturePlan, Plan};

use crate::commands::{load, Failure};
use crate::manifest::{
    self, layout_digest, new_run_id, FeatureEntry, FileSum, Incoming, Manifest, RankIdentity,
    RANK_KEY,
};

pub(crate) fn other(e: impl std::fmt::Display) -> Failure {
    Failure::Other(e.to_string())
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

/// The prefix of the sibling folders runs write into before renaming over `out`.
fn staging_prefix(out: &Path) -> String {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "shards".into());
    format!(".{name}.tmp-")
}

/// This run's staging folder, `.<out>.tmp-<pid>` next to `out`.
fn staging_dir(out: &Path) -> PathBuf {
    out.with_file_name(format!("{}{}", staging_prefix(out), std::process::id()))
}

/// Removes staging folders of earlier runs into `out` whose process is gone (killed
/// mid-run): on Linux, a pid without `/proc/<pid>`. A live run's folder is left alone.
fn remove_stale_staging(out: &Path) {
    let (Some(parent), prefix) = (out.parent(), staging_prefix(out)) else {
        return;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = Path::new("/proc").join(pid.to_string()).exists();
        if pid != std::process::id() && !alive && Path::new("/proc/self").exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Without `--workflow` every feature of the spec is required; a missing one that only
/// some workflows have says so, and names them.
fn without_workflow(req: &Request, e: RuntimeError) -> Failure {
    let RuntimeError::Missing { feature } = &e else {
        return other(e);
    };
    let with: Vec<&str> = req
        .plan
        .workflows
        .iter()
        .filter(|(_, fs)| fs.contains(feature))
        .map(|(w, _)| w.as_str())
        .collect();
    if req.workflow.is_some() || with.len() == req.plan.workflows.len() {
        return other(e);
    }
    other(format!(
        "{e}; without --workflow every feature of the spec is required, and `{feature}` is in workflow {with:?} only: pass --workflow for the workflow this sample is for"
    ))
}

/// What one sample is sharded with.
pub struct Request<'a> {
    /// The spec's plan.
    pub plan: &'a Plan,
    /// The CP mesh `(cp0, cp1)`.
    pub mesh: [usize; 2],
    /// The workflow the sample is for (`None`: every feature of the spec).
    pub workflow: Option<&'a str>,
    /// Keys not in the spec carried along into every rank file.
    pub passthrough: &'a [String],
    /// Threads for value checks and block writes.
    pub threads: usize,
    /// Report each rank file on stderr.
    pub verbose: bool,
}

/// Shards one serial sample file into `out/rank-<r>.safetensors` + `manifest.json`.
pub fn shard(
    spec: &Path,
    features: &Path,
    mesh: [usize; 2],
    workflow: Option<&str>,
    passthrough: &[String],
    threads: usize,
    out: &Path,
) -> Result<String, Failure> {
    let (_, plan) = load(spec)?;
    if out.exists() && std::fs::read_dir(out).map_or(true, |mut d| d.next().is_some()) {
        return Err(other(format!(
            "{} already exists and is not empty; choose a new --out",
            out.display()
        )));
    }
    let req = Request {
        plan: &plan,
        mesh,
        workflow,
        passthrough,
        threads,
        verbose: true,
    };
    shard_sample(&req, features, out)?;
    Ok(format!(
        "wrote {} rank files and manifest.json to {}",
        mesh[0] * mesh[1],
        out.display()
    ))
}

/// Shards one sample file into `out` (absent or empty): staged next to it, renamed into
/// place at the end, so a failure leaves nothing. Returns the bytes written.
pub fn shard_sample(req: &Request, features: &Path, out: &Path) -> Result<u64, Failure> {
    let mapped = Mapped::open(features).map_err(other)?;
    let sample = mapped.sample();
    let metadata = sample_metadata(req.plan, &mapped, req.workflow)?;
    let opts = Options {
        workflow: req.workflow.map(str::to_owned),
        passthrough: req.passthrough.iter().cloned().collect::<BTreeSet<_>>(),
        threads: req.threads,
    };
    let placed = place(req.plan, req.mesh, &sample, &opts).map_err(|e| without_workflow(req, e))?;
    remove_stale_staging(out);
    let staging = staging_dir(out);
    // Whatever fails from here on, this run's staging folder goes.
    let result = write_shards(req, &placed, &metadata, &staging).and_then(|bytes| {
        if out.exists() {
            std::fs::remove_dir(out).map_err(|e| {
                other(format!(
                    "{}: {e} (another run wrote it first?)",
                    out.display()
                ))
            })?;
        }
        std::fs::rename(&staging, out)
            .map_err(|e| other(format!("cannot move shards into {}: {e}", out.display())))?;
        Ok(bytes)
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    result
}

fn write_shards(
    req: &Request,
    placed: &Placed,
    metadata: &Metadata,
    dir: &Path,
) -> Result<u64, Failure> {
    let plan = req.plan;
    std::fs::create_dir_all(dir).map_err(|e| other(format!("{}: {e}", dir.display())))?;
    let mesh = placed.layout.mesh;
    let world: usize = mesh.iter().product();
    let run = new_run_id(plan);
    let layout_sha256 = layout_digest(&placed.layout).map_err(other)?;
    let headers = (0..world)
        .map(|rank| {
            let identity = RankIdentity {
                run: run.clone(),
                rank,
                mesh,
                layout_sha256: layout_sha256.clone(),
            };
            let mut header = metadata.clone();
            header.insert(
                RANK_KEY.into(),
                serde_json::to_string(&identity).map_err(other)?,
            );
            Ok(header)
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    let names: Vec<String> = (0..world)
        .map(|r| format!("rank-{r}.safetensors"))
        .collect();
    let paths: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
    let (layout, shapes) = (placed.layout.clone(), &placed.shapes);
    let intake = placed.intake.clone();
    let passthrough: Vec<String> = placed.passthrough.keys().cloned().collect();
    let written = write_rank_files(plan, placed, &headers, &paths, req.threads).map_err(other)?;
    if req.verbose {
        eprintln!(
            "{world} rank files written ({} x {} mesh)",
            mesh[0], mesh[1]
        );
    }
    let sums: BTreeMap<String, FileSum> = names.into_iter().zip(written).collect();
    let features = shapes
        .iter()
        .map(|(n, s)| {
            let t = featshard_exec::validate::tensor_plan(plan, n).map_err(other)?;
            Ok((
                n.clone(),
                FeatureEntry {
                    dtype: t.dtype.name().to_owned(),
                    placements: t.placements.clone(),
                    global_stride: contiguous_stride(&s.global_shape),
                    global_shape: s.global_shape.clone(),
                    padded_shape: s.padded_shape.clone(),
                    serial_shape: s.serial_shape.clone(),
                    local_shape: s.local_shape.clone(),
                },
            ))
        })
        .collect::<Result<_, Failure>>()?;
    let manifest = Manifest {
        version: manifest::MANIFEST_VERSION,
        spec: plan.source.clone(),
        mesh,
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
    };
    let text = serde_json::to_string_pretty(&manifest).map_err(other)?;
    std::fs::write(dir.join("manifest.json"), text + "\n")
        .map_err(|e| other(format!("{}: {e}", dir.display())))?;
    Ok(manifest.files.values().map(|f| f.bytes).sum())
}

/// Whether `dir` holds a finished sample of this plan, mesh and workflow: its manifest
/// reads, and every rank file has the size and checksum it was written with.
pub fn verify(
    plan: &Plan,
    mesh: [usize; 2],
    workflow: Option<&str>,
    dir: &Path,
) -> Result<u64, String> {
    let text = std::fs::read_to_string(dir.join("manifest.json")).map_err(|e| e.to_string())?;
    let m = manifest::parse(&text, plan)?;
    if m.mesh != mesh || m.workflow.as_deref() != workflow {
        return Err(format!(
            "sharded for mesh {:?}, workflow {:?}",
            m.mesh, m.workflow
        ));
    }
    let world: usize = mesh.iter().product();
    if m.files.len() != world {
        return Err(format!(
            "{} rank files recorded for {world} ranks",
            m.files.len()
        ));
    }
    for (name, want) in &m.files {
        let got = manifest::sum_of_file(&dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
        if got != *want {
            return Err(format!(
                "{name} differs from what was written (size or checksum)"
            ));
        }
    }
    Ok(m.files.values().map(|f| f.bytes).sum())
}
