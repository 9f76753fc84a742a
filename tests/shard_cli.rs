//! `featshard shard` / `assemble` on files: the round trip, the manifest, and that a
//! failure writes nothing.
#![cfg(feature = "runtime")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use featshard_runtime::synthetic::{self, Shape};
use tch::Tensor;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn featshard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_featshard"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run featshard")
}

fn spec() -> String {
    root().join("examples/boltz2.yaml").display().to_string()
}

fn write_sample(path: &Path, drop: Option<&str>) -> BTreeMap<String, Tensor> {
    let (_, plan) = featshard::spec::compile_file(&root().join("examples/boltz2.yaml")).unwrap();
    let shape = Shape {
        sizes: [
            ("tokens", 11),
            ("msa", 4),
            ("ensemble", 2),
            ("disto_ensemble", 1),
            ("templates", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        counts: [("atoms".to_owned(), vec![3, 0, 2, 5, 1, 0, 0, 4, 2, 1, 6])].into(),
        mapped: [("rset".to_owned(), 4)].into(),
    };
    let mut sample = synthetic::sample(&plan, Some("inference"), &shape, 11).unwrap();
    if let Some(d) = drop {
        sample.remove(d);
    }
    let list: Vec<(String, Tensor)> = sample
        .iter()
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    Tensor::write_safetensors(&list, path).unwrap();
    sample
}

fn read(path: &Path) -> BTreeMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

#[test]
fn shard_then_assemble_gives_back_the_input_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("sample.safetensors");
    let sample = write_sample(&input, None);
    let shards = dir.path().join("shards");
    let out = featshard(&[
        "shard",
        &spec(),
        "--features",
        &input.display().to_string(),
        "--mesh",
        "3x3",
        "--workflow",
        "inference",
        "--out",
        &shards.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..9 {
        assert!(
            shards.join(format!("rank-{r}.safetensors")).exists(),
            "rank {r}"
        );
    }
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shards.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["mesh"], serde_json::json!([3, 3]));
    let pair = &manifest["features"]["token_pair_pad_mask"];
    assert_eq!(
        pair["placements"],
        serde_json::json!([{"shard": 0}, {"shard": 1}])
    );
    assert_eq!(pair["serial_shape"], serde_json::json!([11, 11]));
    assert_eq!(pair["global_shape"], serde_json::json!([12, 12]));
    assert_eq!(pair["local_shape"], serde_json::json!([4, 4]));
    assert_eq!(manifest["layout"]["sizes"]["atoms"], 24);
    // Each rank file holds exactly its block.
    let rank4 = read(&shards.join("rank-4.safetensors"));
    assert_eq!(rank4["token_pair_pad_mask"].size(), vec![4, 4]);

    let back = dir.path().join("back.safetensors");
    let out = featshard(&[
        "assemble",
        &spec(),
        "--shards",
        &shards.display().to_string(),
        "--out",
        &back.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let back = read(&back);
    assert_eq!(
        back.keys().collect::<Vec<_>>(),
        sample.keys().collect::<Vec<_>>()
    );
    for (name, x) in &sample {
        assert!(back[name].equal(x), "{name} differs after the round trip");
    }

    let padded = dir.path().join("padded.safetensors");
    let out = featshard(&[
        "assemble",
        &spec(),
        "--shards",
        &shards.display().to_string(),
        "--out",
        &padded.display().to_string(),
        "--padded",
    ]);
    assert!(out.status.success());
    assert_eq!(read(&padded)["token_pair_pad_mask"].size(), vec![12, 12]);
}

#[test]
fn a_bad_sample_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("sample.safetensors");
    write_sample(&input, Some("ref_pos"));
    let shards = dir.path().join("shards");
    let out = featshard(&[
        "shard",
        &spec(),
        "--features",
        &input.display().to_string(),
        "--mesh",
        "2x3",
        "--workflow",
        "inference",
        "--out",
        &shards.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("feature `ref_pos`: missing from the sample")
    );
    assert!(!shards.exists(), "a failed shard left output behind");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("sample.safetensors")]
    );
}

#[test]
fn shard_refuses_a_non_empty_output_folder() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("sample.safetensors");
    write_sample(&input, None);
    let out = featshard(&[
        "shard",
        &spec(),
        "--features",
        &input.display().to_string(),
        "--mesh",
        "2x2",
        "--workflow",
        "inference",
        "--out",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists and is not empty"));
}

#[test]
fn assemble_refuses_shards_of_another_spec() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("sample.safetensors");
    write_sample(&input, None);
    let shards = dir.path().join("shards");
    let out = featshard(&[
        "shard",
        &spec(),
        "--features",
        &input.display().to_string(),
        "--mesh",
        "1x1",
        "--workflow",
        "inference",
        "--out",
        &shards.display().to_string(),
    ]);
    assert!(out.status.success());
    let other = dir.path().join("other.yaml");
    std::fs::write(
        &other,
        std::fs::read_to_string(spec()).unwrap() + "\n# edited\n",
    )
    .unwrap();
    let out = featshard(&[
        "assemble",
        &other.display().to_string(),
        "--shards",
        &shards.display().to_string(),
        "--out",
        &dir.path().join("x.safetensors").display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("was sharded with a different spec"));
}
