//! The on-disk format of pre-sharded samples: a sample's `manifest.json` (what its rank
//! files hold and how to put them back together), the identity every rank file carries,
//! and a dataset's `dataset.json`. Read with every number checked before anything
//! trusts it; shared by the writer (`featshard shard`) and every reader.

use std::collections::BTreeMap;

use crate::ir::{Placement, Source};
use crate::limits::check_length;
use crate::mesh::{Mesh, Named};
use crate::plan::{FeatureShapes, Plan, SampleLayout, TensorPlan};
use serde::{Deserialize, Serialize};

/// Version of manifest.json: 4 names the mesh's axes (`{"cp": 4}`). Versions 2 and 3
/// gave the mesh as two sizes (`[4, 1]` for one axis) and are refused by name: their
/// samples are sharded again.
pub const MANIFEST_VERSION: u32 = 4;

/// How rank files store the blocks of features with a compact form (one-hot features
/// and maps, masks); every other block is stored as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// Each block as the model takes it: any safetensors reader loads it as is.
    #[default]
    Dense,
    /// One-hot blocks as indices, masks as bits: featshard's readers expand them.
    Compact,
}

impl Encoding {
    /// The name the command line and the manifest use.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Dense => "dense",
            Encoding::Compact => "compact",
        }
    }
}

/// `DIR/manifest.json`: what the rank files hold and how to put them back together.
#[derive(Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version ([`MANIFEST_VERSION`]).
    pub version: u32,
    /// The spec file name and the SHA-256 of its text.
    pub spec: Source,
    /// The mesh, its axes named: `{"cp": 4}`, `{"cp0": 3, "cp1": 3}`.
    pub mesh: Named,
    /// How the rank files store blocks with a compact form.
    pub encoding: Encoding,
    /// The workflow sharded, if one was chosen.
    pub workflow: Option<String>,
    /// Run-time lengths, padded lengths and owner-block positions of the sample.
    pub layout: SampleLayout,
    /// Every tensor feature in the rank files, by name.
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
    /// Size and CRC-32 of every rank file, as written: a finished sample is verified
    /// against them before a dataset run skips it.
    #[serde(default)]
    pub files: BTreeMap<String, FileSum>,
    /// This run's identity, which every rank file of it carries (with its rank, the
    /// mesh and the SHA-256 of `layout`): rank files swapped, taken from another run or
    /// a manifest edited after the run are refused.
    pub run: String,
    /// The sample file as it was read: a dataset run redoes a sample whose file differs
    /// now (re-featurized). Absent in manifests of earlier versions (then redone too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceStamp>,
}

/// What identifies a sample file's contents without reading its data: size,
/// modification time and the SHA-256 of its safetensors header (names, dtypes, shapes,
/// offsets, metadata).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStamp {
    /// Size in bytes.
    pub bytes: u64,
    /// Modification time: seconds and nanoseconds since the epoch.
    pub mtime: (i64, i64),
    /// SHA-256 of the header bytes.
    pub header_sha256: String,
}

/// The header entry naming a rank file's place: `RANK_KEY` -> JSON of this. A spec
/// feature cannot be named so (names are snake_case).
pub const RANK_KEY: &str = "featshard.rank";

/// What a rank file says of itself.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct RankIdentity {
    /// The run this file belongs to.
    pub run: String,
    /// Its rank on the mesh.
    pub rank: usize,
    /// The mesh, its axes named.
    pub mesh: Named,
    /// SHA-256 of the manifest's layout.
    pub layout_sha256: String,
    /// How the file stores blocks with a compact form.
    #[serde(default)]
    pub encoding: Encoding,
}

impl Manifest {
    /// `Err` naming rank file `name` unless `got` is the size and CRC-32 recorded for
    /// it when it was written.
    pub fn check_file(&self, name: &str, got: FileSum) -> Result<(), String> {
        match self.files.get(name) {
            Some(want) if *want == got => Ok(()),
            Some(want) if want.bytes != got.bytes => Err(format!(
                "{name}: {} bytes, the manifest recorded {} (truncated or replaced?)",
                got.bytes, want.bytes
            )),
            Some(_) => Err(format!(
                "{name}: its CRC-32 is not the one recorded when it was written (corrupted or edited)"
            )),
            None => Err(format!("{name}: the manifest records no such file")),
        }
    }

    /// `Err` naming the first feature entry that is not what `plan` makes of the
    /// layout. No digest covers the entries; a reader checks them (after a rank file's
    /// identity has vouched for the layout) before it trusts a shape or stride in them.
    pub fn check_entries(&self, plan: &Plan) -> Result<(), String> {
        let names: Vec<&str> = self.features.keys().map(String::as_str).collect();
        let shapes = plan
            .shapes_of(&self.layout, names)
            .map_err(|e| e.to_string())?;
        for (name, entry) in &self.features {
            let (Some(t), Some(s)) = (plan.tensor(name), shapes.get(name)) else {
                return Err(format!(
                    "feature `{name}` is not a tensor feature of the spec"
                ));
            };
            if *entry != FeatureEntry::new(t, s) {
                return Err(format!(
                    "feature `{name}`: its entry is not what the spec makes of the manifest's layout (edited after the run?)"
                ));
            }
        }
        Ok(())
    }

    /// `Err` saying what is wrong unless `entry` (a rank file's [`RANK_KEY`] header
    /// entry) says the file is rank `rank` of this run and mesh, written for the layout
    /// whose digest is `layout_sha256` (this manifest's, computed by the reader).
    pub fn check_rank(
        &self,
        entry: Option<&str>,
        rank: usize,
        layout_sha256: &str,
    ) -> Result<(), String> {
        let found: RankIdentity = entry
            .and_then(|t| serde_json::from_str(t).ok())
            .ok_or_else(|| format!("not a featshard rank file (no `{RANK_KEY}` in its header)"))?;
        Err(if found.run != self.run {
            format!("is from run {}, the manifest's is {}", found.run, self.run)
        } else if found.rank != rank {
            format!(
                "holds rank {}, not rank {rank} (rank files swapped?)",
                found.rank
            )
        } else if found.mesh != self.mesh {
            format!(
                "was written for mesh {}, the manifest says {}",
                found.mesh, self.mesh
            )
        } else if found.layout_sha256 != layout_sha256 {
            "was written for another layout: the manifest's lengths or positions were edited".into()
        } else if found.encoding != self.encoding {
            format!(
                "stores its blocks {}, the manifest says {} (edited after the run?)",
                found.encoding.name(),
                self.encoding.name()
            )
        } else {
            return Ok(());
        })
    }
}

/// A file's size and CRC-32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSum {
    /// Size in bytes.
    pub bytes: u64,
    /// CRC-32 of the bytes.
    pub crc32: u32,
}

/// The SHA-256 of a layout's JSON, which rank files carry.
pub fn layout_digest(layout: &SampleLayout) -> Result<String, String> {
    let text = serde_json::to_string(layout).map_err(|e| e.to_string())?;
    Ok(crate::lower::sha256_hex(&text))
}

/// What intake removed from a sample before placing it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Incoming {
    /// Keys dropped (`drop`, `other_keys: drop`).
    pub dropped: Vec<String>,
    /// Semantics that arrived padded: their real lengths.
    pub arrived: BTreeMap<String, usize>,
    /// Semantics whose unowned rows were dropped: how many.
    pub unowned_rows: BTreeMap<String, usize>,
}

/// One tensor feature of the rank files.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeatureEntry {
    /// Its dtype, as torch names it.
    pub dtype: String,
    /// Its placements on `(cp0, cp1)`.
    pub placements: Vec<Placement>,
    /// The DTensor's global shape (co-sharded axes count one block).
    pub global_shape: Vec<usize>,
    /// The DTensor's contiguous strides.
    pub global_stride: Vec<usize>,
    /// Every semantic axis at its padded length.
    pub padded_shape: Vec<usize>,
    /// The serial shape (unpadded).
    pub serial_shape: Vec<usize>,
    /// Each rank's block.
    pub local_shape: Vec<usize>,
}

impl FeatureEntry {
    /// The entry of feature `t` with shapes `s`.
    pub fn new(t: &TensorPlan, s: &FeatureShapes) -> FeatureEntry {
        FeatureEntry {
            dtype: t.dtype.name().to_owned(),
            placements: t.placements.clone(),
            global_stride: crate::layout::contiguous_stride(&s.global_shape),
            global_shape: s.global_shape.clone(),
            padded_shape: s.padded_shape.clone(),
            serial_shape: s.serial_shape.clone(),
            local_shape: s.local_shape.clone(),
        }
    }
}

/// Reads a manifest for `plan`: its version, spec, mesh and layout checked. Every size
/// within the spec crate's limits, every position inside its padded axis, and the
/// layout's shapes resolvable, so nothing later indexes out of range.
pub fn parse(text: &str, plan: &Plan) -> Result<Manifest, String> {
    check_version(text, "manifest", MANIFEST_VERSION)?;
    let m: Manifest = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if m.spec.sha256 != plan.source.sha256 {
        return Err(format!(
            "sharded with a different spec (sha256 {}); this spec has sha256 {}",
            m.spec.sha256, plan.source.sha256
        ));
    }
    let mesh = plan.mesh.mesh_of(&m.mesh)?;
    if m.layout.mesh != mesh {
        return Err(format!(
            "the layout is for mesh {}, the manifest's is {}",
            plan.mesh.named(m.layout.mesh),
            m.mesh
        ));
    }
    check_layout(&m, plan)?;
    Ok(m)
}

fn check_layout(m: &Manifest, plan: &Plan) -> Result<(), String> {
    let l = &m.layout;
    for (s, &n) in l.sizes.iter().chain(&l.padded) {
        check_length(s, n)?;
    }
    for (s, pos) in &l.positions {
        let (Some(&n), Some(&padded)) = (l.sizes.get(s), l.padded.get(s)) else {
            return Err(format!("`{s}` has positions but no length"));
        };
        if pos.len() != n || pos.iter().any(|&p| p >= padded) {
            return Err(format!(
                "the positions of `{s}` do not fit its {n} items in {padded} places"
            ));
        }
    }
    let names: Vec<&str> = m.features.keys().map(String::as_str).collect();
    plan.shapes_of(l, names)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// `Err` unless JSON `text` is a `what` of version `current`; an earlier version is
/// refused by name (it gave the mesh as sizes without axis names).
fn check_version(text: &str, what: &str, current: u32) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let v: Version = serde_json::from_str(text).map_err(|e| e.to_string())?;
    match v.version {
        n if n == current => Ok(()),
        n if n < current => Err(format!(
            "{what} version {n} was written by an earlier featshard, which gave the mesh as sizes without axis names (this one reads version {current}): shard the samples again"
        )),
        n => Err(format!(
            "{what} version {n} (this featshard reads {current})"
        )),
    }
}

/// Version of `dataset.json`: 2 names the mesh's axes; version 1 is refused by name.
pub const DATASET_VERSION: u32 = 2;

/// `OUT/dataset.json`: every sample of the run and how it went.
#[derive(Debug, Serialize, Deserialize)]
pub struct DatasetManifest {
    /// Format version ([`DATASET_VERSION`]).
    pub version: u32,
    /// The spec file name and the SHA-256 of its text.
    pub spec: Source,
    /// The mesh, its axes named.
    pub mesh: Named,
    /// The workflow sharded, if one was chosen.
    pub workflow: Option<String>,
    /// Every sample of the run.
    pub samples: Vec<SampleEntry>,
}

/// One sample of a dataset run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SampleEntry {
    /// The sample's folder under OUT (its file name without `.safetensors`).
    pub name: String,
    /// The sample file read.
    pub source: std::path::PathBuf,
    /// How it went.
    pub status: Status,
    /// Bytes of its rank files.
    pub bytes: u64,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How one sample of a dataset run went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Sharded by this run.
    Sharded,
    /// Already finished and verified: skipped.
    Verified,
    /// Refused or not written; the error says why.
    Failed,
}

/// Reads a dataset's `dataset.json` for `plan` and a CP mesh: refuses another spec or
/// mesh.
pub fn parse_dataset(text: &str, plan: &Plan, mesh: Mesh) -> Result<DatasetManifest, String> {
    check_version(text, "dataset", DATASET_VERSION)?;
    let d: DatasetManifest = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if d.spec.sha256 != plan.source.sha256 {
        return Err(format!(
            "sharded with a different spec (sha256 {})",
            d.spec.sha256
        ));
    }
    let named = plan.mesh.named(mesh);
    if d.mesh != named {
        return Err(format!("sharded for mesh {}, this mesh is {named}", d.mesh));
    }
    Ok(d)
}
