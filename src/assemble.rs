//! `featshard assemble`: rank files back into one sample file, on the byte executor
//! (the inverse of `featshard shard`, for checking what was written; no libtorch).

use std::collections::BTreeMap;
use std::path::Path;

use featshard_exec::assemble::{assemble, dense_blocks, footprints, unpad, Dense};
use featshard_exec::files::{self, Mapped};
use featshard_exec::rank_file::RunFiles;

use crate::commands::{load, Failure};
use crate::manifest::{self, layout_digest, Manifest, RANK_KEY};
use crate::room;
use crate::shards::other;
use crate::staging;

/// The metadata every rank file carries in its header (rank 0's, its identity
/// removed; [`RunFiles::open`] has compared it with the manifest's).
fn rank_metadata(rank0: &Mapped) -> files::Metadata {
    let mut metadata = rank0.header().metadata.clone();
    metadata.remove(RANK_KEY);
    metadata
}

/// The manifest of a shard folder, read and checked against the plan.
fn read_manifest(shards: &Path, plan: &featshard_spec::Plan) -> Result<Manifest, Failure> {
    let path = shards.join("manifest.json");
    let text = manifest::read_text(&path).map_err(other)?;
    manifest::parse(&text, plan).map_err(|e| other(format!("{}: {e}", path.display())))
}

/// Puts rank files back together into one sample file (serial, or padded with `padded`);
/// with `verify`, each rank file's CRC-32 is checked against the manifest first.
pub fn assemble_files(
    spec: &Path,
    shards: &Path,
    out: &Path,
    padded_output: bool,
    verify: bool,
) -> Result<String, Failure> {
    let (_, plan) = load(spec)?;
    staging::check_existing(out, false)?;
    let manifest = read_manifest(shards, &plan)?;
    let world: usize = manifest.mesh.iter().product();
    let layout_sha256 = layout_digest(&manifest.layout).map_err(other)?;
    let paths: Vec<_> = (0..world)
        .map(|rank| shards.join(format!("rank-{rank}.safetensors")))
        .collect();
    let run = RunFiles::new(&plan, &manifest, &layout_sha256);
    let mut mapped = Vec::with_capacity(world);
    for (rank, path) in paths.iter().enumerate() {
        mapped.push(run.open(path, rank, verify).map_err(other)?);
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
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty());
    room::check_assembly(
        parent.unwrap_or(Path::new(".")),
        &footprints(&plan, layout, &ranks).map_err(other)?,
    )?;
    // One rank file at a time, so that a corrupt stored block names its file.
    let mut dense = Vec::with_capacity(world);
    for (sample, path) in ranks.into_iter().zip(&paths) {
        let one = dense_blocks(&plan, layout, manifest.encoding, vec![sample])
            .map_err(|e| other(format!("{}: {e}", path.display())))?;
        dense.extend(one);
    }
    let ranks = dense;
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
    let metadata = rank_metadata(&mapped[0]);
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
