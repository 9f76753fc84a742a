//! The shard folder format lives in the spec crate ([`featshard_spec::shards`]); here,
//! what writing and verifying files needs: checksums and a fresh run identity.

pub use featshard_spec::shards::*;

use featshard_spec::plan::Plan;

/// A file's size and CRC-32, read in pieces (a finished sample being verified).
pub fn sum_of_file(path: &std::path::Path) -> std::io::Result<FileSum> {
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

/// A fresh identity for one run: time, process and spec, hashed.
pub fn new_run_id(plan: &Plan) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{nanos} {} {}", std::process::id(), plan.source.sha256);
    featshard_spec::sha256_hex(&seed)[..32].to_owned()
}
