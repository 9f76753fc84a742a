//! `featshard shard` / `assemble` on files: the round trip, the manifest, and that a
//! failure writes nothing.
#![cfg(feature = "runtime")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod support;

use featshard_runtime::synthetic::{self, Shape};
use support::cli::{featshard, root, shard, shard_encoded, spec, spec_for};
use tch::Tensor;

fn write_sample(path: &Path, drop: Option<&str>) -> BTreeMap<String, Tensor> {
    let (_, plan) = featshard::spec::compile_file(&root().join("examples/boltz2.yaml")).unwrap();
    let shape =
        Shape::boltz(vec![3, 0, 2, 5, 1, 0, 0, 4, 2, 1, 6], 4, Some(4)).with("templates", 1);
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
    assert_eq!(
        manifest["mesh"],
        serde_json::json!({"cp_axis_0": 3, "cp_axis_1": 3})
    );
    let pair = &manifest["features"]["token_pair_pad_mask"];
    assert_eq!(
        pair["placements"],
        serde_json::json!([{"shard": 0}, {"shard": 1}])
    );
    assert_eq!(pair["serial_shape"], serde_json::json!([11, 11]));
    assert_eq!(pair["global_shape"], serde_json::json!([12, 12]));
    assert_eq!(pair["local_shape"], serde_json::json!([4, 4]));
    assert_eq!(manifest["layout"]["sizes"]["atoms"], 24);
    // Each rank file holds exactly its block, compact by default: the 4x4 mask block
    // as 16 bits, a one-hot feature as its indices.
    assert_eq!(manifest["encoding"], "compact");
    let rank4 = read(&shards.join("rank-4.safetensors"));
    assert_eq!(rank4["token_pair_pad_mask"].size(), vec![2]);
    assert_eq!(rank4["token_pair_pad_mask"].kind(), tch::Kind::Uint8);
    let res_type = &manifest["features"]["res_type"]["local_shape"];
    assert_eq!(
        rank4["res_type"].size(),
        vec![res_type[0].as_i64().unwrap()]
    );

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
    // The pipeline made the derived pair mask; everything else is the input.
    let mut names: Vec<&String> = sample.keys().collect();
    let derived = "token_pair_pad_mask".to_owned();
    names.push(&derived);
    names.sort();
    assert_eq!(back.keys().collect::<Vec<_>>(), names);
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
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("manifest.json: sharded with a different spec"),
        "{err}"
    );
}

fn real(name: &str) -> PathBuf {
    root()
        .join("tests/data/real")
        .join(format!("{name}.safetensors"))
}

/// `featshard assemble` (the byte executor on mapped rank files) writes the file the
/// tch runtime's `assemble` and `unpad` (its adapter over the executor, on tensors read
/// by libtorch) make of the same rank files, serialized by safetensors, byte for byte
/// (`padded`: the padded layout, `--padded`). Before the runtime became an adapter,
/// this held against its own tensor implementation on every real sample and mesh.
fn assert_same_as_tch(spec: &str, shards: &Path, serial_out: &Path, padded: bool, what: &str) {
    let (_, plan) = featshard::spec::compile_file(Path::new(spec)).unwrap();
    let text = std::fs::read_to_string(shards.join("manifest.json")).unwrap();
    let manifest = featshard::spec::shards::parse(&text, &plan).unwrap();
    let world = manifest.layout.mesh.ranks();
    let ranks: Vec<_> = (0..world)
        .map(|r| {
            let path = shards.join(format!("rank-{r}.safetensors"));
            featshard_runtime::files::read_tensors(&path).unwrap()
        })
        .collect();
    let layout = &manifest.layout;
    let workflow = manifest.workflow.as_deref();
    let mut result = featshard_runtime::assemble(&plan, layout, workflow, &ranks).unwrap();
    if !padded {
        result = featshard_runtime::unpad(&plan, layout, &result).unwrap();
    }
    let mut metadata = manifest.metadata.clone();
    metadata.remove(featshard::spec::shards::RANK_KEY);
    let want = featshard_runtime::files::serialize(&result, &metadata).unwrap();
    let got = if padded {
        let out = serial_out.with_extension("padded.safetensors");
        let run = featshard(&[
            "assemble",
            spec,
            "--shards",
            &shards.display().to_string(),
            "--out",
            &out.display().to_string(),
            "--padded",
        ]);
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        std::fs::read(out).unwrap()
    } else {
        std::fs::read(serial_out).unwrap()
    };
    assert!(
        got == want,
        "{what} (padded: {padded}): the two executors' files differ"
    );
}

/// `featshard assemble` of a shard folder (`--padded` with `padded`): the file's bytes.
fn assembled(spec: &str, shards: &Path, padded: bool) -> Vec<u8> {
    let out = shards.with_extension(format!("assembled-{padded}.safetensors"));
    let (shards, file) = (shards.display().to_string(), out.display().to_string());
    let mut args = vec!["assemble", spec, "--shards", &shards, "--out", &file];
    if padded {
        args.push("--padded");
    }
    let run = featshard(&args);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    std::fs::read(out).unwrap()
}

/// Bytes of the rank files in a shard folder.
fn folder_bytes(shards: &Path) -> u64 {
    std::fs::read_dir(shards)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("rank-"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// Each real sample, unchanged, through `shard` and `assemble`, on (cp0, cp1) meshes and
/// on one-axis meshes `(cp,)` of 1, 2, 3, 4 and 8 ranks (the same spec, its `mesh:` line
/// changed): the round trip gives the sample's real items (incoming atom pads dropped,
/// as the manifest records), the dropped keys gone and the derived pair mask made.
#[test]
fn real_featurizer_samples_shard_and_assemble_back() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "prot60_nomsa",
        "prot60_smiles",
        "boltz_cp/prot60_nomsa",
        "boltz_cp/prot60_smiles",
    ] {
        let sample = read(&real(name));
        let real_atoms = sample["atom_pad_mask"]
            .sum(tch::Kind::Int64)
            .int64_value(&[]);
        for mesh in ["1x1", "2x2", "3x3", "2x3", "1", "2", "3", "4", "8"] {
            let spec = spec_for(mesh);
            let shards = dir
                .path()
                .join(format!("{}-{mesh}", name.replace('/', "_")));
            let out = shard_encoded(&real(name), mesh, &shards, "dense");
            assert!(
                out.status.success(),
                "{name} {mesh}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let compact = shards.with_extension("compact");
            let out = shard(&real(name), mesh, &compact);
            assert!(
                out.status.success(),
                "{name} {mesh}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let manifest: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(shards.join("manifest.json")).unwrap(),
            )
            .unwrap();
            assert_eq!(
                manifest["incoming"]["arrived"]["atoms"],
                sample["ref_pos"].size()[0]
            );
            assert_eq!(
                manifest["incoming"]["dropped"],
                serde_json::json!(["ensemble_ref_idxs", "token_to_center_atom"])
            );
            let back = shards.with_extension("back.safetensors");
            let out = featshard(&[
                "assemble",
                &spec,
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
            for padded in [false, true] {
                assert_same_as_tch(&spec, &shards, &back, padded, &format!("{name} {mesh}"));
            }
            // Compact rank files assemble to the same bytes, serial and padded: every
            // block expands to the dense one (masks, pads and remapped ids included).
            for padded in [false, true] {
                let what = format!("{name} {mesh} padded {padded}");
                assert_eq!(
                    assembled(&spec, &compact, padded),
                    assembled(&spec, &shards, padded),
                    "{what}: compact and dense rank files assemble differently"
                );
            }
            assert!(
                folder_bytes(&compact) * 10 < folder_bytes(&shards),
                "{name} {mesh}: compact rank files are not a tenth of the dense ones"
            );
            let back = read(&back);
            assert!(!back.contains_key("token_to_center_atom"));
            assert!(back.contains_key("token_pair_pad_mask"));
            for (f, x) in &sample {
                let Some(y) = back.get(f) else { continue };
                // Axes that arrived padded come back with their real items only.
                let mut x = x.shallow_clone();
                for (d, (&a, &b)) in x.size().clone().iter().zip(&y.size()).enumerate() {
                    if a != b {
                        assert_eq!(b, real_atoms, "{name} {f}: axis {d}");
                        x = x.narrow(d as i64, 0, b);
                    }
                }
                assert!(
                    y.equal(&x),
                    "{name} {mesh} {f}: differs after the round trip"
                );
            }
        }
    }
}

#[test]
fn metadata_in_the_sample_header_reaches_every_rank_file_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let sample = read(&real("prot60_smiles"));
    let input = dir.path().join("with_record.safetensors");
    let tensors: featshard::files::Tensors = sample;
    let record = r#"{"id": "prot60_smiles", "chains": 2}"#.to_owned();
    let meta: featshard::files::Metadata = [
        ("record".to_owned(), record.clone()),
        ("format".to_owned(), "pt".to_owned()),
    ]
    .into();
    featshard::files::write(&input, &tensors, &meta).unwrap();
    let shards = dir.path().join("shards");
    let out = shard(&input, "2x2", &shards);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for rank in 0..4 {
        let m = featshard::files::read_metadata(&shards.join(format!("rank-{rank}.safetensors")))
            .unwrap();
        assert_eq!(m.get("record"), Some(&record), "rank {rank}");
        assert!(
            !m.contains_key("format"),
            "only the spec's metadata features travel"
        );
    }
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
    assert_eq!(
        featshard::files::read_metadata(&back)
            .unwrap()
            .get("record"),
        Some(&record)
    );
}

/// Bad real input: each error names the feature, the axis and the rule, and nothing
/// is written.
#[test]
fn bad_real_input_is_refused_by_name_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sample = read(&real("boltz_cp/prot60_smiles"));
    let save = |name: &str, s: &BTreeMap<String, Tensor>| {
        let path = dir.path().join(format!("{name}.safetensors"));
        featshard::files::write(&path, s, &Default::default()).unwrap();
        path
    };
    // A truncated file.
    let bytes = std::fs::read(real("prot60_smiles")).unwrap();
    let truncated = dir.path().join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    // A mask that disagrees with the counts: one real atom fewer.
    let fewer = sample
        .iter()
        .map(|(n, t)| (n.clone(), t.copy()))
        .collect::<BTreeMap<_, _>>();
    let _ = fewer["atom_pad_mask"].narrow(0, 480, 1).fill_(0.0);
    // A constraint id out of range: atom 481 of 481 real atoms.
    let out_of_range = sample
        .iter()
        .map(|(n, t)| (n.clone(), t.copy()))
        .collect::<BTreeMap<_, _>>();
    let _ = out_of_range["rdkit_bounds_index"]
        .narrow(1, 0, 1)
        .fill_(481);
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        (truncated, vec!["truncated.safetensors"]),
        (
            save("fewer", &fewer),
            vec![
                "feature `atom_counts_per_token`, axis 0 (tokens)",
                "sum to 481, but `atom_pad_mask` marks 480 real atoms",
            ],
        ),
        (
            save("out_of_range", &out_of_range),
            vec![
                "feature `rdkit_bounds_index`",
                "index values must lie in [0, 481) of `atoms`",
            ],
        ),
    ];
    for (input, needles) in cases {
        let shards = dir.path().join("shards");
        let out = shard(&input, "2x2", &shards);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", input.display());
        for n in needles {
            assert!(err.contains(n), "{}: `{n}` not in: {err}", input.display());
        }
        assert!(
            !shards.exists(),
            "a failed shard wrote {}",
            shards.display()
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".shards"))
            .collect();
        assert!(left.is_empty(), "staging left behind");
    }
}

#[test]
fn a_sample_of_one_workflow_sharded_without_workflow_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s");
    let run = featshard(&[
        "shard",
        &spec(),
        "--features",
        &real("prot60_nomsa").display().to_string(),
        "--mesh",
        "3x3",
        "--out",
        &out.display().to_string(),
    ]);
    assert_eq!(run.status.code(), Some(1));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("2 features missing from the sample: `ph_feature`, `temp_feature`")
            && err.contains("`ph_feature` is in workflow [\"training\"] only: pass --workflow"),
        "{err}"
    );
    assert!(!out.exists());
}

/// `sample` as a featurizer that skips its final one-hot calls and casts writes it: each
/// declared one-hot feature as its rows' classes and each one-hot map as its rows' items
/// (int16), -1 for a row with none; each sparse feature as its nonzero elements; masks
/// as bool and ranged ids as uint8.
fn as_indices(sample: &BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
    let (_, plan) = featshard::spec::compile_file(&root().join("examples/boltz2.yaml")).unwrap();
    let mut out: BTreeMap<String, Tensor> = sample
        .iter()
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    // A feature declared one-hot on its last axis, a map one-hot on its last.
    let given = plan.tensors().filter(|(n, t)| {
        let last = t.axes.len() - 1;
        let map = matches!(&t.role, featshard::spec::ir::Role::Index(ix) if ix.one_hot == Some(1));
        sample.contains_key(*n) && (t.one_hot == Some(last) || map && last == 1)
    });
    for (name, _) in given {
        let x = &sample[name];
        let real = x.sum_dim_intlist(-1, false, tch::Kind::Int64).eq(1);
        let none = Tensor::from(-1i64);
        let idx = x.argmax(-1, false).where_self(&real, &none);
        out.insert(name.to_owned(), idx.to_kind(tch::Kind::Int16));
    }
    // Masks as bool, ranged ids as uint8 (their ranges fit).
    for (name, t) in plan.tensors().filter(|(n, _)| sample.contains_key(*n)) {
        let mask = matches!(t.role, featshard::spec::ir::Role::Mask { .. });
        let narrow = match (mask, t.range) {
            (true, _) if t.derived.is_none() => tch::Kind::Bool,
            (false, Some(_)) => tch::Kind::Uint8,
            _ => continue,
        };
        out.insert(name.to_owned(), sample[name].to_kind(narrow));
    }
    // Sparse features as their nonzero elements: `NAME.indices` and `NAME.values`.
    for (name, _) in plan
        .tensors()
        .filter(|(n, t)| t.sparse && sample.contains_key(*n))
    {
        let x = out.remove(name).unwrap();
        let at = x.nonzero().transpose(0, 1).contiguous();
        let flat = x.reshape([-1]);
        let positions = x.ne(0).reshape([-1]).nonzero().reshape([-1]);
        out.insert(format!("{name}.indices"), at);
        out.insert(format!("{name}.values"), flat.index_select(0, &positions));
    }
    out
}

/// A real sample with its one-hot features and maps given as indices and its sparse
/// features as their elements shards, on every mesh and
/// in both encodings, to rank files that assemble to the same bytes as the dense
/// sample's: the dense form is never needed at the source.
#[test]
fn one_hot_features_given_as_indices_shard_as_the_dense_sample() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["prot60_nomsa", "prot60_smiles"] {
        let path = real(name);
        let metadata = featshard_runtime::files::read_metadata(&path).unwrap();
        let given = dir.path().join(format!("{name}-indices.safetensors"));
        featshard_runtime::files::write(&given, &as_indices(&read(&path)), &metadata).unwrap();
        assert!(
            std::fs::metadata(&given).unwrap().len() * 3 < std::fs::metadata(&path).unwrap().len()
        );
        for mesh in ["1x1", "2x2", "3x3", "2x3"] {
            for encoding in ["compact", "dense"] {
                let what = format!("{name} {mesh} {encoding}");
                let (a, b) = (
                    dir.path().join(format!("{what}-a")),
                    dir.path().join(format!("{what}-b")),
                );
                for (input, out) in [(&path, &a), (&given, &b)] {
                    let run = shard_encoded(input, mesh, out, encoding);
                    assert!(
                        run.status.success(),
                        "{what}: {}",
                        String::from_utf8_lossy(&run.stderr)
                    );
                }
                for padded in [false, true] {
                    assert_eq!(
                        assembled(&spec(), &a, padded),
                        assembled(&spec(), &b, padded),
                        "{what} padded {padded}"
                    );
                }
            }
        }
    }
}
