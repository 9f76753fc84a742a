//! The shard folder format lives in the spec crate ([`featshard_spec::shards`]); here,
//! what writing and verifying files needs: checksums and a fresh run identity.

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

/// A file's size and CRC-32, read in pieces (a finished sample being verified); a
/// regular file only.
pub fn sum_of_file(path: &std::path::Path) -> std::io::Result<FileSum> {
    use std::io::Read;
    let mut f = featshard_exec::files::open_regular(path)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
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
