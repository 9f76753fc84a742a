//! A dataset run's resume on any manifest text: a sample folder's `manifest.json` (and
//! the dataset's `dataset.json`) is read, checked and verified, or refused with a
//! message; nothing panics, hangs, or reads a file outside the sample's folder.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use featshard_fuzz::boltz2_plan;
use libfuzzer_sys::fuzz_target;

/// A sample folder of this process, on a memory file system when there is one.
fn folder() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        };
        let dir = Path::new(base).join(format!("featshard-fuzz-resume-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a")).expect("fuzz folder");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = folder().join("a");
    std::fs::write(dir.join("manifest.json"), data).expect("write manifest");
    let source = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/real/prot60_nomsa.safetensors"
    ));
    let req = featshard::shards::Request {
        plan: boltz2_plan(),
        mesh: tile(),
        workflow: Some("inference"),
        passthrough: &[],
        threads: 1,
        verbose: false,
        max_growth: 64.0,
        encoding: featshard::spec::shards::Encoding::Compact,
    };
    if let Ok(bytes) = featshard::shards::verify(&req, source, &dir) {
        // Only a manifest whose rank files are all here, as written, verifies.
        assert!(bytes > 0);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = featshard::spec::shards::parse_dataset(text, boltz2_plan(), tile());
    }
});

/// The 2x2 CP mesh the resumed dataset was sharded for.
fn tile() -> featshard::spec::Mesh {
    featshard::spec::Mesh::new(&[2, 2]).expect("a 2x2 mesh")
}
