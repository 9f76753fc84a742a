//! Hostile input, as a user bent on breaking featshard would give it: every case is
//! refused with an error naming what it must (or has the exact correct outcome), none
//! panics, and none writes outside its target.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};

use support::assert_error;

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

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit 1 (not a panic's 101 or a signal) with every needle in the message.
fn refused(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a refusal (exit 1), got: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
}

const BASE: &str = "\
version: 1
module: demo
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true}
  atoms: {shard: true, owner: tokens, counts: counts}
features:
  counts: {axes: [tokens], dtype: int64}
";

fn with(extra: &str) -> String {
    format!("{BASE}{extra}")
}

// Specs that validate but would generate broken code, or silently drop what they say.

#[test]
fn coshard_with_replicated_is_a_contradiction() {
    assert_error(
        &with("  m: {axes: [atoms, tokens], dtype: int64, coshard: [{axis: 1, follows: 0}], replicated: true}\n"),
        &["spec.yaml:9:", "feature `m`", "`replicated: true` keeps axes whole, but `coshard` splits axis 1 with axis 0"],
    );
}

#[test]
fn coshard_with_replicate_axes_is_a_contradiction() {
    assert_error(
        &with("  m: {axes: [atoms, tokens], dtype: int64, coshard: [{axis: 1, follows: 0}], replicate_axes: [1]}\n"),
        &["spec.yaml:9:", "feature `m`", "`replicate_axes` keeps axes whole"],
    );
}

#[test]
fn an_integer_pad_past_int64_is_refused_not_clamped() {
    assert_error(
        &with("  x: {axes: [tokens], dtype: int64, pad: 9223372036854775808}\n"),
        &["spec.yaml:9:", "feature `x`", "does not fit dtype int64"],
    );
    // The largest int64 still fits.
    featshard_spec::compile_str(
        "spec.yaml",
        &with("  x: {axes: [tokens], dtype: int64, pad: 9223372036854775807}\n"),
    )
    .expect("i64::MAX is an int64 pad");
}

/// A channel size past int64, or channel sizes whose product is, is refused naming the
/// feature, the axis and the line and column: no torch tensor has that shape (before:
/// a size of 2^64-1 validated and sharded; a feature of 2^65 elements validated).
#[test]
fn channel_sizes_past_int64_are_refused() {
    assert_error(
        &with("  x: {axes: [tokens, 18446744073709551615], dtype: uint8}\n"),
        &[
            "spec.yaml:9:22",
            "feature `x`, axis 1 (18446744073709551615)",
            "channel size 18446744073709551615 is more than 9223372036854775807",
        ],
    );
    assert_error(
        &with("  x: {axes: [tokens, 8, 4611686018427387904], dtype: uint8}\n"),
        &[
            "spec.yaml:9:25",
            "feature `x`, axis 2 (4611686018427387904)",
            "the channel sizes up to this one make more than 9223372036854775807 elements",
        ],
    );
    featshard_spec::compile_str(
        "spec.yaml",
        &with("  x: {axes: [tokens, 9223372036854775807], dtype: uint8}\n"),
    )
    .expect("the longest int64 axis validates");
}

#[test]
fn float_pads_that_overflow_their_dtype_are_refused() {
    for (dtype, pad) in [
        ("float16", "70000.0"),
        ("bfloat16", "1.0e39"),
        ("float32", "1.0e39"),
    ] {
        assert_error(
            &with(&format!(
                "  x: {{axes: [tokens], dtype: {dtype}, pad: {pad}}}\n"
            )),
            &[
                "spec.yaml:9:",
                "feature `x`",
                &format!("does not fit dtype {dtype}"),
            ],
        );
    }
    // The largest float16 still fits.
    featshard_spec::compile_str(
        "spec.yaml",
        &with("  x: {axes: [tokens], dtype: float16, pad: 65504.0}\n"),
    )
    .expect("65504 fits float16");
}

#[test]
fn semantics_or_workflows_whose_rust_variants_collide() {
    let text = BASE.replace(
        "  tokens: {shard: true}\n",
        "  tokens: {shard: true}\n  e_1: {shard: false}\n  e1: {shard: false}\n",
    );
    assert_error(
        &text,
        &[
            "spec.yaml:6:3",
            "`e_1` collides with `e1`: both become `Semantic::E1`",
        ],
    );
    let text = format!("{BASE}workflows: [w_1, w1]\n");
    assert_error(
        &text,
        &[
            "spec.yaml:9:",
            "`w_1` collides with `w1`: both become `Workflow::W1`",
        ],
    );
}

#[test]
fn a_name_that_becomes_a_rust_keyword() {
    assert_error(
        &with("  self: {axes: [tokens], dtype: int64}\n"),
        &["spec.yaml:9:", "feature `self`", "becomes `Feature::Self`"],
    );
}

#[test]
fn a_module_that_shadows_an_import_of_the_generated_code() {
    for name in ["torch", "typing", "math"] {
        let text = BASE.replace("module: demo", &format!("module: {name}"));
        assert_error(
            &text,
            &[
                "spec.yaml:2:9",
                &format!("would shadow the `{name}` module"),
            ],
        );
    }
}

#[test]
fn a_module_name_too_long_for_file_names() {
    let text = BASE.replace("module: demo", &format!("module: {}", "m".repeat(300)));
    assert_error(
        &text,
        &[
            "spec.yaml:2:9",
            "module name is 300 characters, more than the limit of 64",
        ],
    );
}

#[test]
fn a_spec_file_name_with_control_characters_is_escaped_in_headers() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("evil\nimport os; os.system('x')\n.yaml");
    std::fs::write(&spec, with("  x: {axes: [tokens], dtype: int64}\n")).unwrap();
    let out_dir = dir.path().join("out");
    let out = featshard(&[
        "generate",
        spec.to_str().unwrap(),
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let py = std::fs::read_to_string(out_dir.join("demo.py")).unwrap();
    let first: Vec<&str> = py.lines().take(3).collect();
    assert!(
        first[0].starts_with("# Generated by featshard"),
        "{first:?}"
    );
    assert!(first[0].contains("evil\\nimport os"), "{first:?}");
    assert!(
        !py.lines().any(|l| l.starts_with("import os")),
        "the file name became code"
    );
}

// Files: no write outside the target, all or nothing.

#[test]
fn generate_does_not_follow_a_symlink_planted_where_it_writes() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // At the old fixed temporary name, and at a destination itself.
    std::os::unix::fs::symlink(&victim, out.join(".boltz2_placements.py.tmp")).unwrap();
    std::os::unix::fs::symlink(&victim, out.join("boltz2_placements.rs")).unwrap();
    let run = featshard(&[
        "generate",
        "examples/boltz2.yaml",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(
        !out.join("boltz2_placements.rs").is_symlink(),
        "the link is replaced, not followed"
    );
}

#[test]
fn generate_is_all_or_nothing_and_leaves_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("boltz2_placements.py"), "old").unwrap();
    // A directory where one output goes: that output cannot be written.
    std::fs::create_dir(out.join("boltz2_placements.rs")).unwrap();
    let run = featshard(&[
        "generate",
        "examples/boltz2.yaml",
        "--out",
        out.to_str().unwrap(),
    ]);
    refused(&run, &["boltz2_placements.rs", "a directory is in the way"]);
    assert_eq!(
        std::fs::read_to_string(out.join("boltz2_placements.py")).unwrap(),
        "old"
    );
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "nothing else was written: {names:?}");
}

#[test]
fn a_spec_that_never_ends_is_refused_with_a_bounded_read() {
    // A device or a FIFO is refused before it is read (a FIFO would wait forever).
    let out = featshard(&["validate", "/dev/zero"]);
    refused(&out, &["not a regular file"]);
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("spec.yaml");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let out = featshard(&["validate", &fifo.display().to_string()]);
    refused(&out, &["not a regular file"]);
    // A regular file past the limit is read only up to it.
    let big = dir.path().join("big.yaml");
    let file = std::fs::File::create(&big).unwrap();
    file.set_len(40 << 20).unwrap();
    let out = featshard(&["validate", &big.display().to_string()]);
    refused(&out, &["more than the limit of 33554432 bytes"]);
}

#[test]
fn a_latin1_spec_names_the_line_and_column_of_the_bad_byte() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("latin1.yaml");
    let mut bytes = b"version: 1\nmodule: demo\n# caf".to_vec();
    bytes.push(0xe9);
    std::fs::write(&spec, bytes).unwrap();
    let out = featshard(&["validate", spec.to_str().unwrap()]);
    refused(
        &out,
        &["not UTF-8", "an invalid byte at line 3", "column 6"],
    );
}

// Run-time arguments: huge numbers are refused by name, never a panic or an abort.

#[test]
fn huge_meshes_and_lengths_for_explain_are_refused() {
    for mesh in [
        "18446744073709551615x2",
        "4294967311x4294967291",
        "100000x99991",
    ] {
        let out = featshard(&["explain", "examples/boltz2.yaml", "--mesh", mesh]);
        assert_eq!(out.status.code(), Some(2), "{mesh}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("ranks") || err.contains("is not a size"),
            "{mesh}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let out = featshard(&[
        "explain",
        "examples/boltz2.yaml",
        "--mesh",
        "3x3",
        "--lengths",
        "tokens=18446744073709551615,atoms=5",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("`tokens` length 18446744073709551615 is more than the limit"));
}

#[cfg(feature = "runtime")]
mod files {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;

    fn real() -> String {
        root()
            .join("tests/data/real/prot60_smiles.safetensors")
            .display()
            .to_string()
    }

    fn shard(input: &str, mesh: &str, out: &Path, extra: &[&str]) -> Output {
        let mut args = vec![
            "shard",
            "examples/boltz2.yaml",
            "--features",
            input,
            "--mesh",
            mesh,
            "--workflow",
            "inference",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        featshard(&args)
    }

    fn assemble(shards: &Path, out: &Path) -> Output {
        featshard(&[
            "assemble",
            "examples/boltz2.yaml",
            "--shards",
            shards.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
    }

    #[test]
    fn a_huge_mesh_for_shard_or_in_a_manifest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("s");
        for mesh in ["4294967311x4294967291", "1000x1000"] {
            let run = shard(&real(), mesh, &out, &[]);
            assert_eq!(run.status.code(), Some(2), "{mesh}: {}", stderr(&run));
            assert!(
                stderr(&run).contains("more than the limit of 65536 ranks"),
                "{}",
                stderr(&run)
            );
        }
        let ok = shard(&real(), "2x2", &out, &[]);
        assert!(ok.status.success(), "{}", stderr(&ok));
        let written = "\"mesh\": {\n    \"cp_axis_0\": 2,\n    \"cp_axis_1\": 2\n  }";
        for (mesh, says) in [
            (
                r#"{"cp_axis_0": 1000000, "cp_axis_1": 1000000}"#,
                "more than the limit of 65536 ranks",
            ),
            (
                r#"{"cp_axis_0": 18446744073709551615, "cp_axis_1": 2}"#,
                "more than the limit of 65536 ranks",
            ),
            (r#"{"cp": 4}"#, "the spec's mesh is (cp_axis_0, cp_axis_1)"),
            // As featshard wrote it before meshes were named: refused by name.
            (
                "[2, 2]",
                "before it named mesh axes; shard the samples again",
            ),
        ] {
            let path = out.join("manifest.json");
            let text = std::fs::read_to_string(&path).unwrap();
            let edited = text.replacen(written, &format!("\"mesh\": {mesh}"), 1);
            assert_ne!(edited, text);
            std::fs::write(&path, &edited).unwrap();
            let run = assemble(&out, &dir.path().join("back.safetensors"));
            refused(&run, &["manifest.json", says]);
            std::fs::write(&path, &text).unwrap();
        }
        // A manifest of an earlier version (its mesh as sizes) is refused by name.
        let path = out.join("manifest.json");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replacen("\"version\": 4", "\"version\": 3", 1)).unwrap();
        let run = assemble(&out, &dir.path().join("back.safetensors"));
        refused(
            &run,
            &[
                "manifest version 3 was written by an earlier featshard",
                "shard the samples again",
            ],
        );
        std::fs::write(&path, &text).unwrap();
    }

    #[test]
    fn assemble_refuses_swapped_foreign_or_edited_shards() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        assert!(shard(&real(), "2x2", &a, &[]).status.success());
        assert!(shard(&real(), "2x2", &b, &[]).status.success());
        let back = dir.path().join("back.safetensors");
        assert!(
            assemble(&a, &back).status.success(),
            "the untouched run assembles"
        );
        // Two rank files swapped.
        let (r1, r2) = (a.join("rank-1.safetensors"), a.join("rank-2.safetensors"));
        let tmp = dir.path().join("swap");
        std::fs::rename(&r1, &tmp).unwrap();
        std::fs::rename(&r2, &r1).unwrap();
        std::fs::rename(&tmp, &r2).unwrap();
        refused(
            &assemble(&a, &back),
            &["rank-1.safetensors", "holds rank 2, not rank 1"],
        );
        std::fs::rename(&r1, &tmp).unwrap();
        std::fs::rename(&r2, &r1).unwrap();
        std::fs::rename(&tmp, &r2).unwrap();
        // A rank file of another run of the same shapes.
        std::fs::copy(b.join("rank-3.safetensors"), a.join("rank-3.safetensors")).unwrap();
        refused(&assemble(&a, &back), &["rank-3.safetensors", "is from run"]);
        std::fs::copy(b.join("rank-3.safetensors"), dir.path().join("keep")).unwrap();
        // The manifest's lengths edited after the run (b is intact).
        let path = b.join("manifest.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let edited = text.replacen("\"tokens\": 73", "\"tokens\": 72", 1);
        assert_ne!(edited, text);
        std::fs::write(&path, edited).unwrap();
        refused(
            &assemble(&b, &back),
            &[
                "rank-0.safetensors",
                "the manifest's lengths or positions were edited",
            ],
        );
    }

    fn sample_with(
        edit: impl Fn(&mut BTreeMap<String, tch::Tensor>),
    ) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let mut s = featshard::files::read_tensors(Path::new(&real())).unwrap();
        edit(&mut s);
        let path = dir.path().join("sample.safetensors");
        featshard::files::write(&path, &s, &Default::default()).unwrap();
        let p = path.display().to_string();
        (dir, p)
    }

    #[test]
    fn mask_values_other_than_0_and_1_are_refused() {
        for bad in [f64::NAN, 7.0] {
            let (dir, input) = sample_with(|s| {
                let m = s["token_resolved_mask"].copy();
                let _ = m.narrow(0, 5, 1).fill_(bad);
                s.insert("token_resolved_mask".into(), m);
            });
            let out = dir.path().join("s");
            let run = shard(&input, "2x2", &out, &[]);
            refused(
                &run,
                &[
                    "feature `token_resolved_mask`",
                    "a mask holds 0 or 1",
                    "at flat index 5",
                ],
            );
            assert!(!out.exists());
        }
    }

    #[test]
    fn passing_through_a_key_the_sample_lacks_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("s");
        let run = shard(&real(), "2x2", &out, &["--passthrough", "recrod"]);
        refused(&run, &["feature `recrod`: missing from the sample"]);
        assert!(!out.exists());
    }

    #[test]
    fn a_sample_that_never_ends_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("s");
        refused(
            &shard("/dev/zero", "2x2", &out, &[]),
            &["/dev/zero", "not a regular file"],
        );
        // A header that claims more than the file holds.
        let lie = dir.path().join("lie.safetensors");
        let mut bytes = (1u64 << 40).to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        std::fs::write(&lie, bytes).unwrap();
        refused(
            &shard(lie.to_str().unwrap(), "2x2", &out, &[]),
            &["its header claims 1099511627776 bytes"],
        );
    }

    #[test]
    fn a_run_that_fails_after_staging_removes_its_staging() {
        // `--out` is an empty folder at the start (so the run goes ahead), but one that
        // cannot be replaced at the end: as when another run wrote it first.
        let dir = tempfile::tempdir().unwrap();
        let real_dir = dir.path().join("elsewhere");
        std::fs::create_dir(&real_dir).unwrap();
        let out = dir.path().join("s");
        std::os::unix::fs::symlink(&real_dir, &out).unwrap();
        let run = shard(&real(), "2x2", &out, &[]);
        refused(&run, &["s"]);
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp-"))
            .collect();
        assert!(left.is_empty(), "staging left behind: {left:?}");
        assert_eq!(
            std::fs::read_dir(&real_dir).unwrap().count(),
            0,
            "nothing written through the link"
        );
    }

    #[test]
    fn concurrent_runs_into_one_folder_leave_one_whole_result_and_no_staging() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("s");
        let input = real();
        let args = [
            "shard",
            "examples/boltz2.yaml",
            "--features",
            &input,
            "--mesh",
            "2x2",
            "--workflow",
            "inference",
            "--out",
            out.to_str().unwrap(),
        ];
        let runs: Vec<_> = (0..3)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_featshard"))
                    .args(args)
                    .current_dir(root())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("run featshard")
            })
            .collect();
        let outputs: Vec<Output> = runs
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let won = outputs.iter().filter(|o| o.status.success()).count();
        assert_eq!(won, 1, "exactly one run writes the folder");
        for lost in outputs.iter().filter(|o| !o.status.success()) {
            refused(lost, &["s"]);
        }
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["s"], "only the result, no staging");
        let back = dir.path().join("back.safetensors");
        let run = assemble(&out, &back);
        assert!(
            run.status.success(),
            "the winner's folder is whole: {}",
            stderr(&run)
        );
    }

    #[test]
    fn staging_left_by_a_killed_run_is_removed_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("s");
        // A pid that cannot be running: above the kernel's pid limit.
        let stale = dir.path().join(".s.tmp-4194304999");
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("rank-0.safetensors"), vec![0u8; 1024]).unwrap();
        let run = shard(&real(), "2x2", &out, &[]);
        assert!(run.status.success(), "{}", stderr(&run));
        assert!(!stale.exists(), "the dead run's staging folder is gone");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            [std::ffi::OsString::from("s")],
            "only the output remains"
        );
    }
}

// Values of the wrong kind are named by feature and axis, with their line and column.

#[test]
fn an_axis_that_is_neither_a_name_nor_a_size() {
    assert_error(
        &with("  x: {axes: [tokens, {a: 1}], dtype: int64}\n"),
        &[
            "spec.yaml:9:22",
            "feature `x`",
            "axis 1",
            "an axis is a semantic name or a channel size, not {\"a\":1}",
        ],
    );
    assert_error(
        &with("  x: {axes: [tokens, -3], dtype: int64}\n"),
        &["spec.yaml:9:22", "feature `x`", "axis 1", "not -3"],
    );
}

#[test]
fn a_pad_that_is_not_a_scalar() {
    assert_error(
        &with("  x: {axes: [tokens], dtype: int64, pad: [1, 2]}\n"),
        &[
            "spec.yaml:9:",
            "feature `x`",
            "`pad` is a bool or a number, not [1,2]",
        ],
    );
}

#[test]
fn a_mask_that_names_nothing() {
    assert_error(
        &with("  m: {axes: [tokens], dtype: float32, mask: {of: tokens}}\n"),
        &[
            "spec.yaml:9:",
            "feature `m`",
            "`mask` names a semantic or a list of them",
        ],
    );
    assert_error(
        &with("  m: {axes: [tokens], dtype: float32, mask: []}\n"),
        &["spec.yaml:9:", "feature `m`", "`mask: []` masks nothing"],
    );
}

#[test]
fn check_covers_a_generated_parity_test() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gen");
    let run = featshard(&[
        "generate",
        "examples/boltz2.yaml",
        "--out",
        out.to_str().unwrap(),
        "--tests",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(featshard(&[
        "check",
        "examples/boltz2.yaml",
        "--out",
        out.to_str().unwrap()
    ])
    .status
    .success());
    let test = out.join("test_boltz2_placements_parity.py");
    std::fs::write(
        &test,
        std::fs::read_to_string(&test).unwrap() + "\n# edited\n",
    )
    .unwrap();
    let run = featshard(&[
        "check",
        "examples/boltz2.yaml",
        "--out",
        out.to_str().unwrap(),
    ]);
    refused(&run, &["stale:", "test_boltz2_placements_parity.py"]);
}

#[test]
fn a_deep_ownership_chain_is_refused_once_at_its_leaf() {
    let mut text = String::from(
        "version: 1\nmodule: demo\nmesh: {cp: [cp0, cp1]}\nsemantics:\n  s0: {shard: true}\n",
    );
    let mut features = String::from("features:\n");
    for i in 1..997 {
        text.push_str(&format!(
            "  s{i}: {{shard: true, owner: s{}, counts: c{i}}}\n",
            i - 1
        ));
        features.push_str(&format!("  c{i}: {{axes: [s{}], dtype: int64}}\n", i - 1));
    }
    let rendered = support::errors_of(&format!("{text}{features}"));
    let deep: Vec<&str> = rendered
        .lines()
        .filter(|l| l.contains("owners deep"))
        .collect();
    assert_eq!(deep.len(), 1, "{rendered}");
    assert!(
        deep[0].contains("semantic `s996`") && deep[0].contains("more than 16 owners deep"),
        "{}",
        deep[0]
    );
}

#[test]
fn a_quoted_boolean_is_a_string_not_a_flag() {
    let text = BASE.replace("  tokens: {shard: true}", "  tokens: {shard: \"yes\"}");
    assert_error(
        &text,
        &[
            "spec.yaml:5:12",
            "string \"yes\", expected `true` or `false` (unquoted)",
        ],
    );
}

#[test]
fn duplicate_entries_in_only_and_mask() {
    let text = format!("{BASE}workflows: [a, b]\n").replace(
        "features:\n",
        "features:\n  x: {axes: [tokens], dtype: int64, only: [a, a]}\n  m: {axes: [tokens], dtype: float32, mask: [tokens, tokens]}\n",
    );
    assert_error(
        &text,
        &["feature `x`", "workflow `a` is listed twice in `only`"],
    );
    assert_error(
        &text,
        &["feature `m`", "`tokens` is listed twice in `mask`"],
    );
}

#[test]
fn a_one_axis_domain_spec_refuses_a_two_axis_mesh() {
    let run = featshard(&["explain", "examples/weather.yaml", "--mesh", "3x3"]);
    refused(
        &run,
        &[
            "--mesh 3x3: sizes [3, 3] for the spec's mesh (domain)",
            "one size per axis (`3`)",
        ],
    );
    let ok = featshard(&["explain", "examples/weather.yaml", "--mesh", "3"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
}

/// A spec written on one long line (here 3 MB of docs before the error) reports the
/// error's line and column with the snippet around it, not the whole line: before,
/// the message held the line whole (30 MB of spec, 30 to 135 MB of message).
#[test]
fn an_error_on_a_very_long_line_shows_a_snippet() {
    let doc = "x".repeat(3000);
    let features: Vec<String> = (0..1000)
        .map(|i| format!("f{i}: {{axes: [tokens], dtype: float32, doc: {doc}}}"))
        .collect();
    let spec = format!(
        "version: 1\nmodule: demo\nmesh: {{cp: [cp0, cp1]}}\nsemantics: {{tokens: {{shard: true}}}}\nfeatures: {{{}, bad: {{axes: [nowhere], dtype: float32}}}}\n",
        features.join(", ")
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.yaml");
    std::fs::write(&path, &spec).unwrap();
    let out = featshard(&["explain", &path.display().to_string(), "--mesh", "2x2"]);
    refused(&out, &["long.yaml:5:", "`nowhere`"]);
    assert!(
        out.stderr.len() < 4096,
        "{} bytes of error for a {} byte line",
        out.stderr.len(),
        spec.len()
    );
}
