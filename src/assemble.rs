//! `featshard assemble`: rank files back into one sample file, on the byte executor
//! (the inverse of `featshard shard`, for checking what was written; no libtorch).

use std::collections::BTreeMap;
use std::path::Path;

use featshard_exec::assemble::{
    dense_blocks, footprints, Assembler, Dense, RankByRank, SerialAssembler,
};
use featshard_exec::files;
use featshard_exec::shard_folder::ShardFolder;

use crate::commands::{load, Failure};
use crate::room;
use crate::shards::other;
use crate::staging;

/// Puts rank files back together into one sample file (serial, or padded with `padded`);
/// with `verify`, each rank file's CRC-32 is checked against the manifest first. One
/// rank file is mapped at a time (its blocks copied out, then its map dropped), so a
/// mesh of any size the writer accepts is read back.
pub fn assemble_files(
    spec: &Path,
    shards: &Path,
    out: &Path,
    padded_output: bool,
    verify: bool,
) -> Result<String, Failure> {
    let (_, plan) = load(spec)?;
    staging::check_existing(out, false)?;
    let folder = ShardFolder::open(&plan, shards, None).map_err(other)?;
    let manifest = folder.manifest();
    let world = manifest.layout.mesh.ranks();
    let layout = &manifest.layout;
    let mut metadata = None;
    let mut passthrough: BTreeMap<String, Dense> = BTreeMap::new();
    let mut assembler: Option<Box<dyn RankByRank>> = None;
    for rank in 0..world {
        let path = folder.rank_path(rank);
        let file = folder.open_rank(&plan, rank, verify).map_err(other)?;
        let mut sample = file.sample();
        if rank == 0 {
            let parent = out.parent().filter(|p| !p.as_os_str().is_empty());
            room::check_assembly(
                parent.unwrap_or(Path::new(".")),
                &footprints(&plan, layout, std::slice::from_ref(&sample)).map_err(other)?,
                padded_output,
            )?;
            metadata = Some(file.metadata());
        }
        for n in &manifest.passthrough {
            if let Some(x) = sample.remove(n) {
                passthrough.entry(n.clone()).or_insert_with(|| Dense {
                    dtype: x.dtype(),
                    shape: x.shape(),
                    bytes: x.to_bytes(),
                });
            }
        }
        // A corrupt stored block names its file; the file must not have changed while
        // its blocks were copied in.
        let at = |e: featshard_exec::ExecError| other(format!("{}: {e}", path.display()));
        let dense = dense_blocks(&plan, layout, manifest.encoding, vec![sample]).map_err(at)?;
        let into = match &mut assembler {
            Some(a) => a,
            None => {
                let workflow = manifest.workflow.as_deref();
                let first = &dense[0];
                // The padded layouts, or the serial sample made straight from the
                // ranks' real items: a padded global may be far larger than the sample.
                let made: Box<dyn RankByRank> = match padded_output {
                    true => Box::new(Assembler::new(&plan, layout, workflow, first).map_err(at)?),
                    false => {
                        Box::new(SerialAssembler::new(&plan, layout, workflow, first).map_err(at)?)
                    }
                };
                assembler.insert(made)
            }
        };
        into.add(rank, &dense[0]).map_err(at)?;
        file.check_unchanged().map_err(other)?;
    }
    let assembler = assembler.ok_or_else(|| other("a mesh of no ranks".to_owned()))?;
    let mut result = assembler.finish().map_err(other)?;
    result.extend(passthrough);
    write(&plan, &result, &metadata.unwrap_or_default(), out)?;
    Ok(format!(
        "wrote {} features ({}) to {}",
        result.len(),
        if padded_output { "padded" } else { "serial" },
        out.display()
    ))
}

/// The assembled sample into `out`, under the keys the sample file had: a nested
/// feature's path joined by the spec's separator.
fn write(
    plan: &featshard_spec::plan::Plan,
    result: &BTreeMap<String, Dense>,
    metadata: &files::Metadata,
    out: &Path,
) -> Result<(), Failure> {
    let keys: Vec<_> = result.keys().map(|n| plan.inputs.key_of(n)).collect();
    let tensors: Vec<_> = result
        .values()
        .zip(&keys)
        .map(|(d, k)| (k.as_ref(), d.dtype, d.shape.clone(), d.bytes.as_slice()))
        .collect();
    let bytes = files::serialize(&tensors, metadata).map_err(other)?;
    staging::write_file(out, &bytes)
}
