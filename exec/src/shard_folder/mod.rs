//! A pre-sharded sample's folder, the one home of its files for every front end: the
//! rank files written (`write`), the manifest read (bounded) and checked against the
//! plan and the mesh, and each rank's file opened and checked once (`check`), its
//! blocks then views of that one map, as stored (dense or compact). `featshard shard`
//! and `assemble`, the tch runtime's and the Python package's `PreshardedDataset` only
//! turn these views into tensors; none opens a checked file a second time.
//!
//! The manifest's types are the spec crate's (`featshard_spec::shards`); a dataset of
//! folders is listed in `dataset.json` ([`read_dataset`]).

mod check;
mod write;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use featshard_spec::ir::DType;
use featshard_spec::plan::Plan;
use featshard_spec::shards::{
    self, layout_digest, DatasetManifest, Manifest, SourceStamp, RANK_KEY,
};
use featshard_spec::Mesh;

pub use write::{rank_file_sizes, write_rank_files};

use crate::buffer::packed;
use crate::files::{read_bounded, Mapped, Metadata, Sample};

/// A folder's manifest.
pub const MANIFEST: &str = "manifest.json";

/// The stamp of a mapped sample file: its size and modification time when opened, and
/// the SHA-256 of its header (what a folder records of the sample it was made from).
pub fn stamp_of(sample: &Mapped) -> SourceStamp {
    let (bytes, mtime) = sample.opened();
    let end = (sample.header().data_start as usize).min(sample.bytes().len());
    let header = String::from_utf8_lossy(&sample.bytes()[..end]);
    SourceStamp {
        bytes,
        mtime,
        header_sha256: featshard_spec::sha256_hex(&header),
    }
}

/// The stamp of the sample file at `path` now (its header read, its data not).
pub fn stamp_now(path: &Path) -> Result<SourceStamp, String> {
    let mapped = Mapped::open(path).map_err(|e| e.to_string())?;
    Ok(stamp_of(&mapped))
}

/// A fresh identity for one run of `plan`: time, process and spec, hashed (what each of
/// its rank files records).
pub fn new_run_id(plan: &Plan) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{nanos} {} {}", std::process::id(), plan.source.sha256);
    featshard_spec::sha256_hex(&seed)[..32].to_owned()
}

/// A dataset's list of sample folders.
pub(crate) const DATASET: &str = "dataset.json";

/// Largest manifest read (a 2^27-item layout's positions are about 1 GB of JSON).
const MAX_MANIFEST_BYTES: u64 = 2 << 30;

/// Largest `dataset.json` read (a million samples' entries).
const MAX_DATASET_BYTES: u64 = 1 << 30;

/// Rank `rank`'s file name in a folder.
pub fn rank_file_name(rank: usize) -> String {
    format!("rank-{rank}.safetensors")
}

/// A text file of a folder, a regular file only (never waited on as a FIFO) and at most
/// `limit` bytes; the error names the file.
fn read_text(path: &Path, limit: u64) -> Result<String, String> {
    let bytes = read_bounded(path, limit).map_err(|e| e.to_string())?;
    String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", path.display()))
}

/// The manifest at `path`, read (bounded) and checked against `plan`.
pub fn read_manifest(plan: &Plan, path: &Path) -> Result<Manifest, String> {
    let text = read_text(path, MAX_MANIFEST_BYTES)?;
    shards::parse(&text, plan).map_err(|e| format!("{}: {e}", path.display()))
}

/// `manifest` written into `dir` as its `manifest.json`, which [`read_manifest`] reads.
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), String> {
    let text = serde_json::to_string_pretty(manifest).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(MANIFEST), text + "\n").map_err(|e| format!("{}: {e}", dir.display()))
}

/// `index` written into the dataset folder `root` as its `dataset.json` (through a
/// temporary file renamed into place: a reader sees the old index or the new one),
/// which [`read_dataset`] reads.
pub fn write_dataset(root: &Path, index: &DatasetManifest) -> Result<(), String> {
    let text = serde_json::to_string_pretty(index).map_err(|e| e.to_string())?;
    let tmp = root.join(format!(".{DATASET}.tmp"));
    std::fs::write(&tmp, text + "\n")
        .and_then(|()| std::fs::rename(&tmp, root.join(DATASET)))
        .map_err(|e| format!("cannot write {}: {e}", root.display()))
}

/// A dataset folder's `dataset.json`, read (bounded) and checked against `plan` and the
/// CP mesh `mesh`.
pub fn read_dataset(plan: &Plan, root: &Path, mesh: Mesh) -> Result<DatasetManifest, String> {
    let path = root.join(DATASET);
    let text = read_text(&path, MAX_DATASET_BYTES)?;
    shards::parse_dataset(&text, plan, mesh).map_err(|e| format!("{}: {e}", path.display()))
}

/// One sample's folder: its manifest read and checked, its layout's digest (what each
/// rank file's identity records) computed once.
#[derive(Debug)]
pub struct ShardFolder {
    dir: PathBuf,
    manifest: Manifest,
    layout_sha256: String,
    /// The manifest's entries checked against the plan, once for every rank file.
    entries: OnceLock<Result<(), String>>,
}

impl ShardFolder {
    /// The folder `dir` for `plan`: its manifest read (bounded) and checked; with
    /// `mesh`, refused unless it was sharded for that CP mesh.
    pub fn open(plan: &Plan, dir: &Path, mesh: Option<Mesh>) -> Result<Self, String> {
        let path = dir.join(MANIFEST);
        let manifest = read_manifest(plan, &path)?;
        if let Some(mesh) = mesh.filter(|m| *m != manifest.layout.mesh) {
            return Err(format!(
                "{}: sharded for mesh {}, this mesh is {}",
                path.display(),
                manifest.mesh,
                plan.mesh.named(mesh)
            ));
        }
        let layout_sha256 = layout_digest(&manifest.layout)?;
        Ok(ShardFolder {
            dir: dir.to_path_buf(),
            manifest,
            layout_sha256,
            entries: OnceLock::new(),
        })
    }

    /// The folder's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The SHA-256 of the manifest's layout.
    pub fn layout_sha256(&self) -> &str {
        &self.layout_sha256
    }

    /// Rank `rank`'s file's path.
    pub fn rank_path(&self, rank: usize) -> PathBuf {
        self.dir.join(rank_file_name(rank))
    }

    /// Rank `rank`'s file, mapped and checked for `plan` (the folder's plan; see the
    /// module): its identity, with `verify` its size and CRC-32, the manifest's entries
    /// (once for the folder), metadata and listing.
    pub fn open_rank(&self, plan: &Plan, rank: usize, verify: bool) -> Result<RankFile, String> {
        let path = self.rank_path(rank);
        let (m, sha) = (&self.manifest, &self.layout_sha256);
        let mapped = check::open_checked(plan, m, sha, &self.entries, &path, rank, verify)?;
        Ok(RankFile { path, mapped })
    }
}

/// One rank's file of a folder, mapped and checked: its blocks are views of the one
/// map, as stored.
#[derive(Debug)]
pub struct RankFile {
    path: PathBuf,
    mapped: Mapped,
}

/// One tensor of a rank file laid out in one buffer: name, dtype, shape, byte offset
/// and bytes.
pub(crate) type Packed = (String, DType, Vec<usize>, usize, usize);

impl RankFile {
    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every tensor of the file, as stored: views of its map.
    pub fn sample(&self) -> Sample<'_> {
        self.mapped.sample()
    }

    /// The header's metadata, the file's identity left out (what every rank file holds).
    pub fn metadata(&self) -> Metadata {
        let mut metadata = self.mapped.header().metadata.clone();
        metadata.remove(RANK_KEY);
        metadata
    }

    /// Where each tensor lies when the file's tensors are laid out in one buffer (as a
    /// rank's buffer is: each aligned), sorted by name; and the buffer's length.
    pub fn packed(&self) -> (Vec<Packed>, usize) {
        let entries = &self.mapped.header().entries;
        let sizes: Vec<usize> = entries
            .iter()
            .map(|e| (e.offsets.1 - e.offsets.0) as usize)
            .collect();
        let (offsets, total) = packed(&sizes);
        let listed = entries
            .iter()
            .zip(offsets.iter().zip(&sizes))
            .map(|(e, (&at, &n))| (e.name.clone(), e.dtype, e.shape.clone(), at, n))
            .collect();
        (listed, total)
    }

    /// Copies every tensor into `out` as [`RankFile::packed`] lays them out (the gaps
    /// zeroed: `out` may be recycled memory), then checks that the file did not change
    /// while it was read. `out` must be the packed length.
    pub fn copy_packed(&self, out: &mut [u8]) -> Result<(), String> {
        let (listed, total) = self.packed();
        if out.len() != total {
            return Err(format!(
                "{}: a buffer of {} bytes for {total}",
                self.path.display(),
                out.len()
            ));
        }
        let header = self.mapped.header();
        let data = &self.mapped.bytes()[header.data_start as usize..];
        let mut end = 0;
        for (e, (_, _, _, at, n)) in header.entries.iter().zip(&listed) {
            let a = e.offsets.0 as usize;
            out[end..*at].fill(0);
            out[*at..at + n].copy_from_slice(&data[a..a + n]);
            end = at + n;
        }
        out[end..].fill(0);
        self.check_unchanged()
    }

    /// Whether the file is as it was when opened (not truncated or written since).
    pub fn check_unchanged(&self) -> Result<(), String> {
        self.mapped
            .check_unchanged(&self.path)
            .map_err(|e| e.to_string())
    }
}
