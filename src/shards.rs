//! `featshard shard` and `featshard assemble`: per-rank safetensors files on disk.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use featshard_runtime::shard::{contiguous_stride, coords};
use featshard_runtime::{assemble, pad, unpad, Features, Options, Padded};
use featshard_spec::ir::Placement;
use featshard_spec::plan::{FeaturePlan, Plan, SampleLayout};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::commands::{load, Failure};
use crate::files::{self, Metadata};

/// Version of manifest.json.
pub const MANIFEST_VERSION: u32 = 2;

/// `DIR/manifest.json`: what the rank files hold and how to put them back together.
#[derive(Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    /// The spec file name and the SHA-256 of its text.
    pub spec: featshard_spec::ir::Source,
    pub mesh: [usize; 2],
    pub workflow: Option<String>,
    /// Run-time lengths, padded lengths and owner-block positions of the sample.
    pub layout: SampleLayout,
    pub features: BTreeMap<String, FeatureEntry>,
    /// Features carried along untouched, in every rank file.
    pub passthrough: Vec<String>,
    /// Metadata features (non-tensor values, as text) from the sample file's header,
    /// in every rank file's header too.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// What intake removed from the sample as emitted: keys dropped, the lengths of
    /// semantics that arrived padded (their pads are not kept), unowned rows dropped.
    #[serde(default)]
    pub incoming: Incoming,
    /// This run's identity, which every rank file of it carries (with its rank, the
    /// mesh and the SHA-256 of `layout`): rank files swapped, taken from another run or
    /// a manifest edited after the run are refused.
    pub run: String,
}

/// The header entry naming a rank file's place: `RANK_KEY` -> JSON of this. A spec
/// feature cannot be named so (names are snake_case).
const RANK_KEY: &str = "featshard.rank";

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct RankIdentity {
    run: String,
    rank: usize,
    mesh: [usize; 2],
    layout_sha256: String,
}

fn layout_digest(layout: &SampleLayout) -> Result<String, Failure> {
    let text = serde_json::to_string(layout).map_err(other)?;
    Ok(featshard_spec::lower::sha256_hex(&text))
}

/// A fresh identity for one run: time, process and spec, hashed.
fn new_run_id(plan: &Plan) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{nanos} {} {}", std::process::id(), plan.source.sha256);
    featshard_spec::lower::sha256_hex(&seed)[..32].to_owned()
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Incoming {
    pub dropped: Vec<String>,
    pub arrived: BTreeMap<String, usize>,
    pub unowned_rows: BTreeMap<String, usize>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct FeatureEntry {
    pub dtype: String,
    pub placements: Vec<Placement>,
    /// The DTensor's global shape (co-sharded axes count one block).
    pub global_shape: Vec<usize>,
    pub global_stride: Vec<usize>,
    pub padded_shape: Vec<usize>,
    pub serial_shape: Vec<usize>,
    pub local_shape: Vec<usize>,
}

fn other(e: impl std::fmt::Display) -> Failure {
    Failure::Other(e.to_string())
}

fn read_features(path: &Path) -> Result<Features, Failure> {
    files::read_tensors(path)
}

/// The metadata features of `workflow` that the sample file's header holds.
fn sample_metadata(plan: &Plan, path: &Path, workflow: Option<&str>) -> Result<Metadata, Failure> {
    let wanted = plan.feature_names(workflow).map_err(other)?;
    let mut meta = files::read_metadata(path)?;
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

/// Shards one serial sample file into `out/rank-<r>.safetensors` + `manifest.json`.
pub fn shard(
    spec: &Path,
    features: &Path,
    mesh: [usize; 2],
    workflow: Option<&str>,
    passthrough: &[String],
    out: &Path,
) -> Result<String, Failure> {
    let (_, plan) = load(spec)?;
    if out.exists() && std::fs::read_dir(out).map_or(true, |mut d| d.next().is_some()) {
        return Err(other(format!(
            "{} already exists and is not empty; choose a new --out",
            out.display()
        )));
    }
    let sample = read_features(features)?;
    let metadata = sample_metadata(&plan, features, workflow)?;
    let opts = Options {
        workflow: workflow.map(str::to_owned),
        passthrough: passthrough.iter().cloned().collect::<BTreeSet<_>>(),
        ..Options::default()
    };
    let padded = pad(&plan, mesh, &sample, &opts).map_err(other)?;
    remove_stale_staging(out);
    let staging = staging_dir(out);
    // Whatever fails from here on, this run's staging folder goes.
    let result = write_shards(&plan, &padded, workflow, &metadata, &staging).and_then(|()| {
        if out.exists() {
            std::fs::remove_dir(out).map_err(|e| {
                other(format!(
                    "{}: {e} (another run wrote it first?)",
                    out.display()
                ))
            })?;
        }
        std::fs::rename(&staging, out)
            .map_err(|e| other(format!("cannot move shards into {}: {e}", out.display())))
    });
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    Ok(format!(
        "wrote {} rank files and manifest.json to {}",
        padded.world_size(),
        out.display()
    ))
}

fn write_shards(
    plan: &Plan,
    padded: &Padded,
    workflow: Option<&str>,
    metadata: &Metadata,
    dir: &Path,
) -> Result<(), Failure> {
    std::fs::create_dir_all(dir).map_err(|e| other(format!("{}: {e}", dir.display())))?;
    let world = padded.world_size();
    let run = new_run_id(plan);
    let layout_sha256 = layout_digest(&padded.layout)?;
    for rank in 0..world {
        let mut tensors: BTreeMap<String, Tensor> = padded
            .rank_blocks(plan, rank)
            .map_err(other)?
            .into_iter()
            .map(|(n, b)| (n, b.tensor))
            .collect();
        for (n, t) in &padded.passthrough {
            tensors.insert(n.clone(), t.shallow_clone());
        }
        let identity = RankIdentity {
            run: run.clone(),
            rank,
            mesh: padded.mesh(),
            layout_sha256: layout_sha256.clone(),
        };
        let mut header = metadata.clone();
        header.insert(
            RANK_KEY.into(),
            serde_json::to_string(&identity).map_err(other)?,
        );
        files::write(
            &dir.join(format!("rank-{rank}.safetensors")),
            &tensors,
            &header,
        )?;
        let [i, j] = coords(padded.mesh(), rank);
        eprintln!("rank {rank} ({i}, {j}): {} of {world} written", rank + 1);
    }
    let features = padded
        .shapes
        .iter()
        .map(|(n, s)| {
            let t = featshard_runtime::sample::tensor_plan(plan, n).map_err(other)?;
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
        version: MANIFEST_VERSION,
        spec: plan.source.clone(),
        mesh: padded.mesh(),
        workflow: workflow.map(str::to_owned),
        layout: padded.layout.clone(),
        features,
        passthrough: padded.passthrough.keys().cloned().collect(),
        metadata: metadata.clone(),
        incoming: Incoming {
            dropped: padded.intake.dropped.clone(),
            arrived: padded.intake.arrived.clone(),
            unowned_rows: padded.intake.unowned.clone(),
        },
        run,
    };
    let text = serde_json::to_string_pretty(&manifest).map_err(other)?;
    std::fs::write(dir.join("manifest.json"), text + "\n")
        .map_err(|e| other(format!("{}: {e}", dir.display())))
}

/// A rank file must say it is rank `rank` of this manifest's run and mesh, laid out as
/// the manifest says.
fn check_identity(
    path: &Path,
    manifest: &Manifest,
    rank: usize,
    layout_sha256: &str,
) -> Result<(), Failure> {
    let header = files::read_metadata(path)?;
    let found: RankIdentity = header
        .get(RANK_KEY)
        .and_then(|t| serde_json::from_str(t).ok())
        .ok_or_else(|| {
            other(format!(
                "{}: not a featshard rank file (no `{RANK_KEY}` in its header)",
                path.display()
            ))
        })?;
    let wrong = if found.run != manifest.run {
        format!(
            "is from run {}, the manifest's is {}",
            found.run, manifest.run
        )
    } else if found.rank != rank {
        format!(
            "holds rank {}, not rank {rank} (rank files swapped?)",
            found.rank
        )
    } else if found.mesh != manifest.mesh {
        format!(
            "was written for mesh {:?}, the manifest says {:?}",
            found.mesh, manifest.mesh
        )
    } else if found.layout_sha256 != layout_sha256 {
        "was written for another layout: the manifest's lengths or positions were edited".into()
    } else {
        return Ok(());
    };
    Err(other(format!("{}: {wrong}", path.display())))
}

/// Puts rank files back together into one sample file (serial, or padded with `padded`).
pub fn assemble_files(
    spec: &Path,
    shards: &Path,
    out: &Path,
    padded_output: bool,
) -> Result<String, Failure> {
    let (_, plan) = load(spec)?;
    let manifest_path = shards.join("manifest.json");
    let text = std::fs::read_to_string(&manifest_path)
        .map_err(|e| other(format!("cannot read {}: {e}", manifest_path.display())))?;
    let manifest: Manifest = serde_json::from_str(&text)
        .map_err(|e| other(format!("{}: {e}", manifest_path.display())))?;
    if manifest.version != MANIFEST_VERSION {
        return Err(other(format!(
            "{}: manifest version {} (this featshard reads {MANIFEST_VERSION})",
            manifest_path.display(),
            manifest.version
        )));
    }
    if manifest.spec.sha256 != plan.source.sha256 {
        return Err(other(format!(
            "{} was sharded with a different spec (sha256 {}); {} has sha256 {}",
            shards.display(),
            manifest.spec.sha256,
            spec.display(),
            plan.source.sha256
        )));
    }
    featshard_spec::limits::check_mesh(&manifest.mesh)
        .map_err(|e| other(format!("{}: {e}", manifest_path.display())))?;
    let world: usize = manifest.mesh.iter().product();
    let layout_sha256 = layout_digest(&manifest.layout)?;
    let mut ranks = Vec::with_capacity(world);
    let mut passthrough = BTreeMap::new();
    for rank in 0..world {
        let path = shards.join(format!("rank-{rank}.safetensors"));
        check_identity(&path, &manifest, rank, &layout_sha256)?;
        let mut f = read_features(&path)?;
        for n in &manifest.passthrough {
            if let Some(t) = f.remove(n) {
                passthrough.entry(n.clone()).or_insert(t);
            }
        }
        ranks.push(f);
    }
    let padded = assemble(
        &plan,
        &manifest.layout,
        manifest.workflow.as_deref(),
        &ranks,
    )
    .map_err(other)?;
    let mut metadata = manifest.metadata.clone();
    metadata.remove(RANK_KEY);
    let mut result = if padded_output {
        padded
    } else {
        unpad(&plan, &manifest.layout, &padded).map_err(other)?
    };
    result.extend(passthrough);
    let tmp = out.with_file_name(format!(
        ".{}.tmp-{}",
        out.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    files::write(&tmp, &result, &metadata)?;
    std::fs::rename(&tmp, out).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        other(format!("cannot write {}: {e}", out.display()))
    })?;
    Ok(format!(
        "wrote {} features ({}) to {}",
        result.len(),
        if padded_output { "padded" } else { "serial" },
        out.display()
    ))
}
