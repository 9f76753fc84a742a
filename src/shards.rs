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
pub const MANIFEST_VERSION: u32 = 1;

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

/// A sibling folder to write into before renaming over `out`.
fn staging_dir(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "shards".into());
    out.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
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
    let staging = staging_dir(out);
    let result = write_shards(&plan, &padded, workflow, &metadata, &staging);
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    if out.exists() {
        std::fs::remove_dir(out).map_err(|e| other(format!("{}: {e}", out.display())))?;
    }
    std::fs::rename(&staging, out).map_err(|e| {
        let _ = std::fs::remove_dir_all(&staging);
        other(format!("cannot move shards into {}: {e}", out.display()))
    })?;
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
        files::write(
            &dir.join(format!("rank-{rank}.safetensors")),
            &tensors,
            metadata,
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
    };
    let text = serde_json::to_string_pretty(&manifest).map_err(other)?;
    std::fs::write(dir.join("manifest.json"), text + "\n")
        .map_err(|e| other(format!("{}: {e}", dir.display())))
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
    let world: usize = manifest.mesh.iter().product();
    let mut ranks = Vec::with_capacity(world);
    let mut passthrough = BTreeMap::new();
    for rank in 0..world {
        let mut f = read_features(&shards.join(format!("rank-{rank}.safetensors")))?;
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
    files::write(&tmp, &result, &manifest.metadata)?;
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
