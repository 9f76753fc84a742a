//! The shard folder format lives in the spec crate ([`featshard_spec::shards`]); here,
//! what writing and verifying files needs: a fresh run identity (checksums are the
//! executor's, `featshard_exec::files`).

pub use featshard_spec::shards::*;

use featshard_spec::plan::Plan;

/// Largest manifest read (a 2^27-item layout's positions are about 1 GB of JSON).
const MAX_MANIFEST_BYTES: u64 = 2 << 30;

/// A manifest's text: a regular file only (never waited on as a FIFO), bounded.
pub fn read_text(path: &std::path::Path) -> Result<String, String> {
    let bytes =
        featshard_exec::files::read_bounded(path, MAX_MANIFEST_BYTES).map_err(|e| e.to_string())?;
    String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", path.display()))
}

pub use featshard_exec::files::sum_of_file;

/// The stamp of a mapped sample file: its size and modification time when opened, and
/// the SHA-256 of its header.
pub fn stamp_of(sample: &featshard_exec::files::Mapped) -> SourceStamp {
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
pub fn stamp_now(path: &std::path::Path) -> Result<SourceStamp, String> {
    let mapped = featshard_exec::files::Mapped::open(path).map_err(|e| e.to_string())?;
    Ok(stamp_of(&mapped))
}

/// A fresh identity for one run: time, process and spec, hashed.
pub fn new_run_id(plan: &Plan) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{nanos} {} {}", std::process::id(), plan.source.sha256);
    featshard_spec::sha256_hex(&seed)[..32].to_owned()
}
