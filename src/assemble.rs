//! `featshard assemble`: rank files back into one sample file, on the tch runtime (the
//! inverse of `featshard shard`, for checking what was written).

use std::collections::BTreeMap;
use std::path::Path;

use featshard_runtime::files;
use featshard_runtime::{assemble, unpad, Features};

use crate::commands::{load, Failure};
use crate::manifest::{self, layout_digest, Manifest, RankIdentity, RANK_KEY};
use crate::shards::other;
use crate::staging;

fn read_features(path: &Path) -> Result<Features, Failure> {
    files::read_tensors(path).map_err(other)
}

/// A rank file must say it is rank `rank` of this manifest's run and mesh, laid out as
/// the manifest says.
fn check_identity(
    path: &Path,
    manifest: &Manifest,
    rank: usize,
    layout_sha256: &str,
) -> Result<(), Failure> {
    let header = files::read_metadata(path).map_err(other)?;
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
    staging::check_existing(out, false)?;
    let manifest_path = shards.join("manifest.json");
    let text = std::fs::read_to_string(&manifest_path)
        .map_err(|e| other(format!("cannot read {}: {e}", manifest_path.display())))?;
    let manifest = manifest::parse(&text, &plan)
        .map_err(|e| other(format!("{}: {e}", manifest_path.display())))?;
    let world: usize = manifest.mesh.iter().product();
    let layout_sha256 = layout_digest(&manifest.layout).map_err(other)?;
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
    let bytes = files::serialize(&result, &metadata).map_err(other)?;
    staging::write_file(out, &bytes)?;
    Ok(format!(
        "wrote {} features ({}) to {}",
        result.len(),
        if padded_output { "padded" } else { "serial" },
        out.display()
    ))
}
