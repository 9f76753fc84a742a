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

/// The size and CRC-32 of bytes in memory (a mapped rank file).
pub fn sum_of_bytes(bytes: &[u8]) -> FileSum {
    FileSum {
        bytes: bytes.len() as u64,
        crc32: crc32fast::hash(bytes),
    }
}

/// `Err` naming `name` when `got` is not the size and CRC-32 the manifest recorded.
pub fn check_sum(manifest: &Manifest, name: &str, got: FileSum) -> Result<(), String> {
    match manifest.files.get(name) {
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

/// A fresh identity for one run: time, process and spec, hashed.
pub fn new_run_id(plan: &Plan) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{nanos} {} {}", std::process::id(), plan.source.sha256);
    featshard_spec::sha256_hex(&seed)[..32].to_owned()
}
