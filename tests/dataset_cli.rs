//! `featshard shard` over a dataset: one folder per sample, failures named while the
//! others go on, resume that skips verified samples and redoes corrupt ones, and a run
//! killed mid-way that the next run completes.
#![cfg(feature = "runtime")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn real(name: &str) -> PathBuf {
    root()
        .join("tests/data/real")
        .join(format!("{name}.safetensors"))
}

fn shard_command(features: &str, out: &Path, jobs: usize) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_featshard"));
    c.args(["shard", "examples/boltz2.yaml", "--features", features])
        .args(["--mesh", "2x2", "--workflow", "inference", "--out"])
        .arg(out)
        .args(["--jobs", &jobs.to_string()])
        .current_dir(root());
    c
}

fn run(features: &str, out: &Path, jobs: usize) -> Output {
    shard_command(features, out, jobs)
        .output()
        .expect("run featshard")
}

/// A folder of `n` samples (copies of the real ones under new names), and the names.
fn dataset(dir: &Path, n: usize) -> (PathBuf, Vec<String>) {
    let data = dir.join("data");
    std::fs::create_dir(&data).unwrap();
    let sources = [
        "prot60_nomsa",
        "prot60_smiles",
        "boltz_cp/prot60_nomsa",
        "boltz_cp/prot60_smiles",
    ];
    let names: Vec<String> = (0..n).map(|i| format!("s{i:02}")).collect();
    for (i, name) in names.iter().enumerate() {
        std::fs::copy(
            real(sources[i % 4]),
            data.join(format!("{name}.safetensors")),
        )
        .unwrap();
    }
    (data, names)
}

fn statuses(out: &Path) -> Vec<(String, String)> {
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("dataset.json")).unwrap()).unwrap();
    m["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn no_staging(dir: &Path) {
    for e in walk(dir) {
        let n = e.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!n.contains(".tmp-"), "staging left behind: {}", e.display());
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn a_dataset_shards_into_one_folder_per_sample_and_names_its_failures() {
    let dir = tempfile::tempdir().unwrap();
    let (data, names) = dataset(dir.path(), 4);
    // One sample the spec refuses; the others go on.
    std::fs::write(data.join("broken.safetensors"), b"not a safetensors file").unwrap();
    let out = dir.path().join("out");
    let first = run(data.to_str().unwrap(), &out, 2);
    let err = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(1), "{err}");
    assert!(err.contains("5 samples into"), "{err}");
    assert!(
        err.contains("4 sharded, 0 already done and verified, 1 failed"),
        "{err}"
    );
    assert!(
        err.contains("  broken: ") && err.contains("broken.safetensors: cannot read"),
        "{err}"
    );
    for name in &names {
        for r in 0..4 {
            assert!(out
                .join(name)
                .join(format!("rank-{r}.safetensors"))
                .exists());
        }
    }
    assert!(!out.join("broken").exists());
    let s = statuses(&out);
    assert_eq!(s.iter().filter(|(_, st)| st == "sharded").count(), 4);
    assert_eq!(
        s.iter().find(|(n, _)| n == "broken").map(|x| x.1.as_str()),
        Some("failed")
    );
    no_staging(dir.path());

    // Resume: finished samples are verified and skipped; a corrupt one is redone.
    std::fs::remove_file(data.join("broken.safetensors")).unwrap();
    let victim = out.join(&names[2]).join("rank-1.safetensors");
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&victim, bytes).unwrap();
    let again = run(data.to_str().unwrap(), &out, 1);
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(
        text.contains("1 sharded, 3 already done and verified, 0 failed"),
        "{text}"
    );
    let s = statuses(&out);
    assert_eq!(
        s.iter().find(|(n, _)| n == &names[2]).map(|x| x.1.as_str()),
        Some("sharded")
    );
}

#[test]
fn two_samples_of_one_name_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("list.txt");
    let a = real("prot60_nomsa");
    let b = real("boltz_cp/prot60_nomsa");
    std::fs::write(&list, format!("{}\n{}\n", a.display(), b.display())).unwrap();
    let out = dir.path().join("out");
    let r = run(&format!("@{}", list.display()), &out, 1);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(
        err.contains("would both shard into `prot60_nomsa`"),
        "{err}"
    );
    assert!(!out.exists());
}

#[test]
fn a_run_killed_mid_way_is_completed_by_the_next_with_nothing_left_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (data, names) = dataset(dir.path(), 16);
    let out = dir.path().join("out");
    let mut child = shard_command(data.to_str().unwrap(), &out, 1)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until some samples are finished, then kill -9.
    let start = Instant::now();
    let finished = |out: &Path| {
        names
            .iter()
            .filter(|n| out.join(n).join("manifest.json").exists())
            .count()
    };
    while finished(&out) < 2 && start.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    let _ = child.wait();
    let done_before = finished(&out);
    assert!(
        done_before >= 2 && done_before < names.len(),
        "killed after {done_before} samples"
    );
    let again = run(data.to_str().unwrap(), &out, 2);
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let skipped: usize = text
        .split(" already done and verified")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        skipped >= done_before,
        "{text}: {done_before} were finished"
    );
    assert_eq!(finished(&out), names.len());
    no_staging(dir.path());
}
