//! The `featshard` binary end to end: exit codes, drift detection, rendering.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

fn boltz2() -> String {
    root().join("examples/boltz2.yaml").display().to_string()
}

fn generate_into(dir: &Path) {
    let out = featshard(&["generate", &boltz2(), "--out", &dir.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn generate_then_check_passes() {
    let dir = tempfile::tempdir().unwrap();
    generate_into(dir.path());
    let out = featshard(&[
        "check",
        &boltz2(),
        "--out",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("5 generated files up to date"));
}

#[test]
fn check_names_a_stale_file_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    generate_into(dir.path());
    let py = dir.path().join("boltz2_placements.py");
    let edited = std::fs::read_to_string(&py)
        .unwrap()
        .replace("Shard(1)", "Shard(0)");
    std::fs::write(&py, edited).unwrap();
    let out = featshard(&[
        "check",
        &boltz2(),
        "--out",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("stale:") && err.contains("boltz2_placements.py"),
        "{err}"
    );
    assert!(!err.contains("boltz2_placements.rs"), "{err}");
}

#[test]
fn check_names_a_missing_file_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    generate_into(dir.path());
    std::fs::remove_file(dir.path().join("boltz2_placements.plan.json")).unwrap();
    let out = featshard(&[
        "check",
        &boltz2(),
        "--out",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("missing:") && err.contains("boltz2_placements.plan.json"),
        "{err}"
    );
}

#[test]
fn validate_reports_a_valid_spec() {
    let out = featshard(&["validate", &boltz2()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout)
        .contains("ok (89 features, 16 semantics, workflows: inference, training)"));
}

#[test]
fn invalid_spec_renders_feature_axis_and_location_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("bad.yaml");
    std::fs::write(
        &spec,
        "version: 1\nmodule: demo\nmesh: {cp: [cp0, cp1]}\nsemantics:\n  tokens: {shard: true}\nfeatures:\n  x: {axes: [tokens, residues], dtype: int64}\n",
    )
    .unwrap();
    let out = featshard(&["validate", &spec.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("feature `x`, axis 1 (residues)"), "{err}");
    assert!(err.contains("bad.yaml:7:22"), "{err}");
}

#[test]
fn several_errors_are_all_rendered() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("bad.yaml");
    std::fs::write(
        &spec,
        "version: 1\nmodule: demo\nmesh: {cp: [cp0, cp1]}\nsemantics:\n  tokens: {shard: true}\nfeatures:\n  x: {axes: [residues], dtype: int64}\n  y: {axes: [tokens], dtype: int8, pad: 1000}\n",
    )
    .unwrap();
    let out = featshard(&[
        "generate",
        &spec.display().to_string(),
        "--out",
        &dir.path().join("o").display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("2 errors"), "{err}");
    assert!(
        err.contains("feature `x`") && err.contains("feature `y`"),
        "{err}"
    );
    assert!(
        !dir.path().join("o").exists(),
        "nothing is written for an invalid spec"
    );
}

#[test]
fn missing_and_non_utf8_specs_fail_cleanly() {
    let out = featshard(&["validate", "no/such/spec.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read spec"));
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("binary.yaml");
    std::fs::write(&spec, [0xff, 0xfe, 0x00, 0x9f]).unwrap();
    let out = featshard(&["validate", &spec.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not UTF-8"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(featshard(&["frobnicate"]).status.code(), Some(2));
    let out = featshard(&["explain", &boltz2(), "--mesh", "3x0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("not a size of at least 1"));
    let out = featshard(&[
        "explain",
        &boltz2(),
        "--mesh",
        "3x3",
        "--lengths",
        "tokens=many",
    ]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn explain_prints_placements_and_shapes() {
    let out = featshard(&[
        "explain",
        &boltz2(),
        "--mesh",
        "3x3",
        "--workflow",
        "inference",
        "--lengths",
        "tokens=100,atoms=700,rset=90,msa=64,ensemble=2,disto_ensemble=1,templates=4",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name} in\n{table}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    // tokens 100 -> 102 (multiple of 3); pair tiles are 34 x 34 on 3x3. Bytes are the
    // padded global shape's: 102 * 102 float32 = 41,616 B; a mask as bits, 1,301 B.
    assert_eq!(
        row("token_pair_pad_mask"),
        "token_pair_pad_mask [tokens, tokens] Shard(0), Shard(1) [102, 102] [34, 34] 41.62 KB 1.30 KB"
    );
    assert_eq!(
        row("frames_idx"),
        "frames_idx [ensemble, tokens, 3] Shard(1), Replicate() [2, 102, 3] [2, 34, 3] 4.90 KB 4.90 KB"
    );
    // One-hot over 33 classes: 102 * 33 int64 dense, one uint8 index per token compact.
    assert_eq!(
        row("res_type"),
        "res_type [tokens, 33] Shard(0), Replicate() [102, 33] [34, 33] 26.93 KB 102 B"
    );
    // A sparse feature's compact bytes are its nonzero entries'; a ranged one narrowed
    // to uint8 (64 MSA rows padded to 66, x 102 ids of 0 to 32: 6,732 B).
    assert_eq!(
        row("type_bonds"),
        "type_bonds [tokens, tokens] Shard(0), Shard(1) [102, 102] [34, 34] 83.23 KB 16 B per nonzero"
    );
    assert_eq!(
        row("msa"),
        "msa [msa, tokens] Shard(0), Shard(1) [66, 102] [22, 34] 53.86 KB 6.73 KB"
    );
    assert!(
        table.contains("bytes per sample (padded global): dense ")
            && table.contains("+ 16 B per nonzero of 3 sparse feature(s)"),
        "{table}"
    );
    assert!(
        !table.contains("temp_feature"),
        "training-only feature listed for inference"
    );
}

#[test]
fn explain_takes_an_empty_sample_and_names_lengths_that_contradict() {
    let rest = "rset=0,msa=0,ensemble=1,disto_ensemble=1,templates=0";
    let explain = |lengths: &str| {
        featshard(&[
            "explain",
            &boltz2(),
            "--mesh",
            "2x2",
            "--lengths",
            &format!("{lengths},{rest}"),
        ])
    };
    // No tokens and no atoms: a sample `shard` accepts, so `explain` does too.
    let empty = explain("tokens=0,atoms=0");
    assert_eq!(empty.status.code(), Some(0), "{}", text(&empty.stderr));
    // Atoms without tokens to own them: a contradiction, named.
    let none = explain("tokens=0,atoms=70");
    assert_eq!(none.status.code(), Some(1));
    assert!(
        text(&none.stderr).contains(
            "semantic `atoms`: 70 items, but `tokens` has length 0: no owner to hold them"
        ),
        "{}",
        text(&none.stderr)
    );
}

#[test]
fn explain_without_lengths_is_symbolic() {
    let out = featshard(&["explain", &boltz2(), "--mesh", "2x3"]);
    assert_eq!(out.status.code(), Some(0));
    let table = text(&out.stdout);
    assert!(
        table.contains("[blocks6(atoms), pad6(tokens)/2]"),
        "{table}"
    );
}

#[test]
fn schema_is_draft_07_json() {
    let out = featshard(&["schema"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("schema is JSON");
    assert_eq!(v["$schema"], "http://json-schema.org/draft-07/schema#");
    assert!(v["properties"]["features"].is_object());
    let out = featshard(&["schema", "--plan"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plan schema is JSON");
    assert!(v["properties"]["version"].is_object());
}

#[test]
fn generating_twice_in_separate_processes_gives_the_same_bytes() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    generate_into(a.path());
    generate_into(b.path());
    for entry in std::fs::read_dir(a.path()).unwrap() {
        let name = entry.unwrap().file_name();
        let x = std::fs::read(a.path().join(&name)).unwrap();
        let y = std::fs::read(b.path().join(&name)).unwrap();
        assert!(x == y, "{name:?} differs between runs");
    }
}

#[test]
fn feature_order_in_the_yaml_does_not_change_the_output() {
    let original = std::fs::read_to_string(root().join("examples/boltz2.yaml")).unwrap();
    // Reverse the one-line feature entries; output is sorted, so only the hash moves.
    let (head, body) =
        original.split_at(original.find("features:\n").unwrap() + "features:\n".len());
    let mut entries: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("    ") && l.contains(": {"))
        .collect();
    let rest: Vec<&str> = body.lines().filter(|l| !entries.contains(l)).collect();
    entries.reverse();
    let shuffled = format!("{head}{}\n{}\n", entries.join("\n"), rest.join("\n"));
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("boltz2.yaml");
    std::fs::write(&spec, &shuffled).unwrap();
    let out_a = dir.path().join("a");
    let out = featshard(&[
        "generate",
        &spec.display().to_string(),
        "--out",
        &out_a.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let golden = root().join("tests/golden/boltz2");
    let strip = |s: String, sha: &str| s.replace(sha, "<sha>");
    let sha_of = |t: &str| featshard::spec::sha256_hex(t);
    for name in [
        "boltz2_placements.py",
        "boltz2_placements.pyi",
        "boltz2_placements.rs",
        "boltz2_placements.plan.json",
    ] {
        let a = strip(
            std::fs::read_to_string(out_a.join(name)).unwrap(),
            &sha_of(&shuffled),
        );
        let g = strip(
            std::fs::read_to_string(golden.join(name)).unwrap(),
            &sha_of(&original),
        );
        assert!(
            a == g,
            "{name} depends on the order of features in the YAML"
        );
    }
}

#[test]
fn the_readme_spec_example_is_valid_and_places_as_its_comments_say() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme.find("```yaml\n").expect("README has a yaml example") + "```yaml\n".len();
    let yaml = &readme[start..start + readme[start..].find("```").unwrap()];
    let (_, plan) = featshard::spec::compile_str("README.md", yaml)
        .unwrap_or_else(|d| panic!("README example is invalid:\n{}", d.render_plain()));
    for line in yaml.lines() {
        // `  name: {...}   # (Shard(0), Replicate())`
        let Some((code, comment)) = line.split_once("# (") else {
            continue;
        };
        let name = code.trim().split(':').next().unwrap();
        let featshard::spec::plan::FeaturePlan::Tensor(t) = &plan.features[name] else {
            panic!("{name} is not a tensor")
        };
        let shown: Vec<String> = t.placements.iter().map(ToString::to_string).collect();
        assert_eq!(
            format!("({})", shown.join(", ")),
            format!("({}", comment.trim()),
            "{name}"
        );
    }
}

#[test]
fn explain_draws_a_features_tiles_plain_when_piped() {
    let out = featshard(&[
        "explain",
        &boltz2(),
        "--mesh",
        "2x3",
        "--feature",
        "token_pair_pad_mask",
        "--lengths",
        "tokens=100,atoms=700,rset=90,msa=64,ensemble=2,disto_ensemble=1,templates=4",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let picture = text(&out.stdout);
    assert!(
        !picture.contains('\x1b'),
        "colour codes when piped:\n{picture}"
    );
    assert!(picture.contains("global shape [102, 102]"), "{picture}");
    for rank in 0..6 {
        assert!(
            picture.contains(&format!("rank {rank} ")),
            "rank {rank} missing:\n{picture}"
        );
    }
    assert_eq!(picture.matches("[51, 34]").count(), 6, "{picture}");
    // tokens 100 -> 102: the last column and the last row hold the 2 pads.
    assert!(
        picture.contains("pad 2 on axis 0, 2 on axis 1"),
        "{picture}"
    );
    let out = featshard(&["explain", &boltz2(), "--mesh", "3x3", "--feature", "coords"]);
    let picture = text(&out.stdout);
    assert!(
        picture.contains("ranks 0,1,2") && picture.contains("columns: replicated over cp_axis_1"),
        "{picture}"
    );
    assert!(
        picture.contains("whole on every rank: axis 0 (ensemble)"),
        "{picture}"
    );
    let out = featshard(&["explain", &boltz2(), "--mesh", "3x3", "--feature", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("feature `nope` is not in the spec"));
}

/// A picture of a mesh of thousands of ranks fits a screen (before: 65,536 ranks took
/// 37 s and 8.5 MB): the first three and the last two rows and columns of tiles, the
/// rest counted; a tile held by many ranks lists the first and the last.
#[test]
fn explain_elides_the_tiles_of_a_large_mesh() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("one_axis.yaml");
    let text_of = std::fs::read_to_string(boltz2()).unwrap();
    std::fs::write(
        &spec,
        text_of.replace("cp: [cp_axis_0, cp_axis_1]", "cp: [cp]"),
    )
    .unwrap();
    let spec = spec.display().to_string();
    let args = ["explain", &spec, "--mesh", "65536", "--feature"];
    let out = featshard(&[&args[..], &["token_pair_pad_mask"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let picture = text(&out.stdout);
    assert!(picture.lines().count() < 40, "{picture}");
    for rank in [0, 1, 2, 65534, 65535] {
        assert!(picture.contains(&format!("rank {rank} ")), "{picture}");
    }
    assert!(!picture.contains("rank 3 "), "{picture}");
    assert!(picture.contains("⋮ 65531 more rows of tiles"), "{picture}");
    assert!(picture.contains("(5 of 65536 tiles drawn"), "{picture}");
    let out = featshard(&[
        "explain",
        &boltz2(),
        "--mesh",
        "2x20",
        "--feature",
        "coords",
    ]);
    let picture = text(&out.stdout);
    assert!(picture.contains("ranks 0,1,2,…,19 (20)"), "{picture}");
}

#[test]
fn explain_svg_draws_every_feature_of_a_workflow() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("all.svg");
    let out = featshard(&[
        "explain",
        &boltz2(),
        "--mesh",
        "3x3",
        "--workflow",
        "inference",
        "--svg",
        &svg.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc = std::fs::read_to_string(&svg).unwrap();
    assert!(doc.starts_with("<svg"), "{doc}");
    assert_eq!(doc.matches("class=\"feature\"").count(), 79);
    let one = dir.path().join("one.svg");
    featshard(&[
        "explain",
        &boltz2(),
        "--mesh",
        "3x3",
        "--feature",
        "msa",
        "--svg",
        &one.display().to_string(),
    ]);
    let doc = std::fs::read_to_string(&one).unwrap();
    assert_eq!(doc.matches("class=\"tile\"").count(), 9);
}
