//! `featshard assemble`: rank files back into one sample file, on the byte executor
//! (the inverse of `featshard shard`, for checking what was written; no libtorch).

use std::collections::BTreeMap;
use std::path::Path;

use featshard_exec::assemble::{assemble, unpad, Dense};
use featshard_exec::files::{self, Mapped};

use crate::commands::{load, Failure};
use crate::manifest::{self, layout_digest, Manifest, RankIdentity, RANK_KEY};
use crate::shards::other;
use crate::staging;

/// A rank file must say it is rank `rank` of this manifest's run and mesh, laid out as
/// the manifest says.
fn check_identity(
    path: &Path,
    file: &Mapped,
    manifest: &Manifest,
    rank: usize,
    layout_sha256: &str,
) -> Result<(), Failure> {
    let found: RankIdentity = file
        .header()
        .metadata
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

/// The manifest of a shard folder, read and checked against the plan.
fn read_manifest(shards: &Path, plan: &featshard_spec::Plan) -> Result<Manifest, Failure> {
    let path = shards.join("manifest.json");
    let file = files::open_regular(&path).map_err(other)?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, 1 << 30), &mut text)
        .map_err(|e| other(format!("cannot read {}: {e}", path.display())))?;
    manifest::parse(&text, plan).map_err(|e| other(format!("{}: {e}", path.display())))
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
    let manifest = read_manifest(shards, &plan)?;
    let world: usize = manifest.mesh.iter().product();
    let layout_sha256 = layout_digest(&manifest.layout).map_err(other)?;
    let paths: Vec<_> = (0..world)
        .map(|rank| shards.join(format!("rank-{rank}.safetensors")))
        .collect();
    let mut mapped = Vec::with_capacity(world);
    for (rank, path) in paths.iter().enumerate() {
        let file = Mapped::open(path).map_err(other)?;
        check_identity(path, &file, &manifest, rank, &layout_sha256)?;
        mapped.push(file);
    }
    let mut ranks: Vec<files::Sample> = mapped.iter().map(Mapped::sample).collect();
    let mut passthrough: BTreeMap<String, Dense> = BTreeMap::new();
    for sample in &mut ranks {
        for n in &manifest.passthrough {
            if let Some(x) = sample.remove(n) {
                passthrough.entry(n.clone()).or_insert_with(|| Dense {
                    dtype: x.dtype(),
                    shape: x.shape(),
                    bytes: x.to_bytes(),
                });
            }
        }
    }
    let layout = &manifest.layout;
    let padded = assemble(&plan, layout, manifest.workflow.as_deref(), &ranks).map_err(other)?;
    let mut result = if padded_output {
        padded
    } else {
        unpad(&plan, layout, padded).map_err(other)?
    };
    result.extend(passthrough);
    for (file, path) in mapped.iter().zip(&paths) {
        file.check_unchanged(path).map_err(other)?;
    }
    let mut metadata = manifest.metadata.clone();
    metadata.remove(RANK_KEY);
    let tensors: Vec<_> = result
        .iter()
        .map(|(n, d)| (n.as_str(), d.dtype, d.shape.clone(), d.bytes.as_slice()))
        .collect();
    let bytes = files::serialize(&tensors, &metadata).map_err(other)?;
    staging::write_file(out, &bytes)?;
    Ok(format!(
        "wrote {} features ({}) to {}",
        result.len(),
        if padded_output { "padded" } else { "serial" },
        out.display()
    ))
}
