//! A sample file changed while it is mapped: truncated (reads past its new end raise
//! SIGBUS) or rewritten in place. Neither crashes the process; both are reported by
//! `check_unchanged`, naming the file, so nothing read from it is kept.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use featshard_exec::files::Mapped;

/// A safetensors file with one float32 tensor of `n` values.
fn sample(path: &Path, n: usize) {
    let data: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![n], &data).unwrap();
    safetensors::serialize_to_file([("x", view)], None, path).unwrap();
}

fn sum_of_bytes(mapped: &Mapped) -> u64 {
    let sample = mapped.sample();
    let x = &sample["x"];
    x.base_bytes().iter().map(|&b| u64::from(b)).sum()
}

#[test]
fn a_file_truncated_while_mapped_is_reported_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.safetensors");
    sample(&path, 1 << 16);
    let mapped = Mapped::open(&path).unwrap();
    assert!(mapped.check_unchanged(&path).is_ok());
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    // Every page past the new end faults; the read completes (with zeros there).
    let _ = sum_of_bytes(&mapped);
    let err = mapped.check_unchanged(&path).unwrap_err().to_string();
    assert!(err.contains("s.safetensors"), "{err}");
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn a_file_written_in_place_while_mapped_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.safetensors");
    sample(&path, 1024);
    let mapped = Mapped::open(&path).unwrap();
    let before = sum_of_bytes(&mapped);
    // Same size, other values, written where the data is.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut f = std::fs::File::options().write(true).open(&path).unwrap();
    f.seek(SeekFrom::End(-8)).unwrap();
    f.write_all(&[7u8; 8]).unwrap();
    drop(f);
    let err = mapped.check_unchanged(&path).unwrap_err().to_string();
    assert!(
        err.contains("s.safetensors") && err.contains("written to"),
        "{err}"
    );
    assert!(before > 0);
}
