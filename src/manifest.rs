//! `manifest.json` of a shard folder: what the rank files hold and how to put them back
//! together, read with every number checked before anything trusts it. Needs no
//! libtorch, so it can be fuzzed on its own.

use std::collections::BTreeMap;

use featshard_spec::ir::Placement;
use featshard_spec::limits::{check_length, check_mesh};
use featshard_spec::plan::{Plan, SampleLayout};
use serde::{Deserialize, Serialize};

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
    /// Size and CRC-32 of every rank file, as written: a finished sample is verified
    /// against them before a dataset run skips it.
    #[serde(default)]
    pub files: BTreeMap<String, FileSum>,
    /// This run's identity, which every rank file of it carries (with its rank, the
    /// mesh and the SHA-256 of `layout`): rank files swapped, taken from another run or
    /// a manifest edited after the run are refused.
    pub run: String,
}

/// The header entry naming a rank file's place: `RANK_KEY` -> JSON of this. A spec
/// feature cannot be named so (names are snake_case).
pub const RANK_KEY: &str = "featshard.rank";

/// What a rank file says of itself.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct RankIdentity {
    pub run: String,
    pub rank: usize,
    pub mesh: [usize; 2],
    pub layout_sha256: String,
}

/// A file's size and CRC-32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSum {
    pub bytes: u64,
    pub crc32: u32,
}

impl FileSum {
    pub fn of(data: &[u8]) -> FileSum {
        FileSum {
            bytes: data.len() as u64,
            crc32: crc32fast::hash(data),
        }
    }

    /// The file's sum, read in pieces (a finished sample being verified).
    pub fn of_file(path: &std::path::Path) -> std::io::Result<FileSum> {
        use std::io::Read;
        let mut f = std::fs::File::open(path)?;
        let (mut hasher, mut bytes) = (crc32fast::Hasher::new(), 0u64);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            bytes += n as u64;
        }
        Ok(FileSum {
            bytes,
            crc32: hasher.finalize(),
        })
    }
}

/// The SHA-256 of a layout's JSON, which rank files carry.
pub fn layout_digest(layout: &SampleLayout) -> Result<String, String> {
    let text = serde_json::to_string(layout).map_err(|e| e.to_string())?;
    Ok(featshard_spec::lower::sha256_hex(&text))
}

/// A fresh identity for one run: time, process and spec, hashed.
pub fn new_run_id(plan: &Plan) -> String {
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

/// Reads a manifest for `plan`: its version, spec, mesh and layout checked. Every size
/// within the spec crate's limits, every position inside its padded axis, and the
/// layout's shapes resolvable, so nothing later indexes out of range.
pub fn parse(text: &str, plan: &Plan) -> Result<Manifest, String> {
    let m: Manifest = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if m.version != MANIFEST_VERSION {
        return Err(format!(
            "manifest version {} (this featshard reads {MANIFEST_VERSION})",
            m.version
        ));
    }
    if m.spec.sha256 != plan.source.sha256 {
        return Err(format!(
            "sharded with a different spec (sha256 {}); this spec has sha256 {}",
            m.spec.sha256, plan.source.sha256
        ));
    }
    check_mesh(&m.mesh)?;
    check_layout(&m, plan)?;
    Ok(m)
}

fn check_layout(m: &Manifest, plan: &Plan) -> Result<(), String> {
    let l = &m.layout;
    if l.mesh != m.mesh {
        return Err(format!(
            "the layout is for mesh {:?}, the manifest's is {:?}",
            l.mesh, m.mesh
        ));
    }
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
