//! Golden files: every generated output of `examples/boltz2.yaml`,
//! `examples/protenix.yaml`, `examples/openfold3.yaml` and the domain-parallel examples, byte for byte.
//!
//! Run with `FEATSHARD_BLESS=1` to rewrite the goldens after an intended change, then
//! review the diff in git.

use std::path::{Path, PathBuf};

use featshard::commands;

// Compiled here as well, so a golden that stops compiling fails the build.
#[allow(dead_code)]
#[rustfmt::skip]
#[path = "golden/boltz2/boltz2_placements.rs"]
mod boltz2_placements;
// Generated text, checked byte for byte: prettyplease's layout, not rustfmt's; the
// tests below read a few of its items.
#[rustfmt::skip]
#[allow(dead_code)]
#[path = "golden/protenix/protenix_placements.rs"]
mod protenix_placements;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn first_difference(expected: &str, actual: &str) -> String {
    for (i, (e, a)) in expected.lines().zip(actual.lines()).enumerate() {
        if e != a {
            return format!("line {}:\n  golden:    {e}\n  generated: {a}", i + 1);
        }
    }
    format!(
        "lengths differ: golden has {} lines, generated {}",
        expected.lines().count(),
        actual.lines().count()
    )
}

fn check_goldens(spec: &Path, golden_dir: &Path) {
    let files = commands::render(spec).expect("example spec must compile");
    let bless = std::env::var_os("FEATSHARD_BLESS").is_some();
    let mut failures = Vec::new();
    for f in &files {
        let path = golden_dir.join(&f.name);
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        if golden == f.contents {
            continue;
        }
        if bless {
            std::fs::create_dir_all(golden_dir).expect("create golden dir");
            std::fs::write(&path, &f.contents).expect("write golden");
        } else {
            failures.push(format!(
                "{} differs from the generated output ({})",
                path.display(),
                first_difference(&golden, &f.contents)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\nrerun with FEATSHARD_BLESS=1 to accept the new output",
        failures.join("\n")
    );
}

#[test]
fn boltz2_generated_files_match_the_goldens() {
    check_goldens(
        &root().join("examples/boltz2.yaml"),
        &root().join("tests/golden/boltz2"),
    );
}

#[test]
fn protenix_generated_files_match_the_goldens() {
    check_goldens(
        &root().join("examples/protenix.yaml"),
        &root().join("tests/golden/protenix"),
    );
}

#[test]
fn openfold3_generated_files_match_the_goldens() {
    check_goldens(
        &root().join("examples/openfold3.yaml"),
        &root().join("tests/golden/openfold3"),
    );
}

/// A feature of a nested dict, named by its path, is a variant of the generated Rust
/// (`constraint_feature.contact` -> `ConstraintFeatureContact`) with its path as name.
#[test]
fn golden_rust_module_names_a_nested_feature_by_its_path() {
    use protenix_placements::{Feature, Placement};
    assert_eq!(
        Feature::ConstraintFeatureContact.placements(),
        &[Placement::Shard(0), Placement::Shard(1)]
    );
    assert_eq!(
        Feature::ConstraintFeatureContact.name(),
        "constraint_feature.contact"
    );
}

#[test]
fn domain_parallel_examples_generated_files_match_the_goldens() {
    for name in ["weather", "pointcloud", "volume"] {
        check_goldens(
            &root().join(format!("examples/{name}.yaml")),
            &root().join(format!("tests/golden/{name}")),
        );
    }
}

#[test]
fn golden_rust_module_compiles_and_holds_the_inferred_tables() {
    use boltz2_placements::{Feature, IndexScope, Placement, Semantic, Workflow};
    assert_eq!(
        Feature::AtomToToken.placements(),
        &[Placement::Shard(0), Placement::Replicate]
    );
    assert_eq!(
        Feature::TokenPairPadMask.placements(),
        &[Placement::Shard(0), Placement::Shard(1)]
    );
    assert_eq!(
        Feature::FramesIdx.placements_dp(),
        &[
            Placement::Shard(0),
            Placement::Shard(2),
            Placement::Replicate
        ]
    );
    assert_eq!(
        Feature::AtomToToken.axis_semantics(),
        &[Some(Semantic::Atoms), Some(Semantic::Tokens)]
    );
    assert_eq!(Feature::from_name("msa"), Some(Feature::Msa));
    assert_eq!(Feature::from_name("nope"), None);
    let index = Feature::FramesIdx.index().expect("frames_idx is an index");
    assert_eq!(
        (index.of, index.scope),
        (Semantic::Atoms, IndexScope::PaddedGlobal)
    );
    assert!(Workflow::Inference
        .features()
        .contains(&Feature::AffinityTokenMask));
    assert!(!Workflow::Training
        .features()
        .contains(&Feature::AffinityTokenMask));
    for f in Feature::ALL {
        assert_eq!(Feature::from_name(f.name()), Some(f));
    }
}

#[test]
fn golden_rust_module_compiles_alone_with_rustc() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = tempfile::tempdir().expect("tempdir");
    let status = std::process::Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "--crate-type",
            "lib",
            "-D",
            "warnings",
            "-o",
        ])
        .arg(out.path().join("libboltz2_placements.rlib"))
        .arg(root().join("tests/golden/boltz2/boltz2_placements.rs"))
        .status()
        .expect("run rustc");
    assert!(
        status.success(),
        "generated Rust module does not compile on its own"
    );
}

/// `schema/featshard.schema.json`, where every example's `yaml-language-server` line
/// points, is `featshard schema`'s output (rewritten with `FEATSHARD_BLESS=1`).
#[test]
fn the_shipped_schema_is_the_generated_one_and_every_example_points_at_it() {
    let path = root().join("schema/featshard.schema.json");
    let generated = commands::schema(false);
    let shipped = std::fs::read_to_string(&path).unwrap_or_default();
    if shipped != generated && std::env::var_os("FEATSHARD_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
    } else {
        assert!(
            shipped == generated,
            "{} is stale: rerun with FEATSHARD_BLESS=1 ({})",
            path.display(),
            first_difference(&shipped, &generated)
        );
    }
    for e in std::fs::read_dir(root().join("examples")).unwrap() {
        let example = e.unwrap().path();
        let text = std::fs::read_to_string(&example).unwrap();
        let reference = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# yaml-language-server: $schema="))
            .unwrap_or_else(|| panic!("{} names no schema", example.display()));
        let target = example.parent().unwrap().join(reference);
        assert!(
            target.exists(),
            "{}: {reference} does not resolve",
            example.display()
        );
        assert_eq!(target.canonicalize().unwrap(), path.canonicalize().unwrap());
    }
}

/// `schema/validate-report.schema.json`, the schema of `featshard validate --format
/// json`, is `featshard schema --report validate`'s output (rewritten with
/// `FEATSHARD_BLESS=1`).
#[test]
fn the_shipped_validate_report_schema_is_the_generated_one() {
    let path = root().join("schema/validate-report.schema.json");
    let generated = featshard::report::validate_schema();
    let shipped = std::fs::read_to_string(&path).unwrap_or_default();
    if shipped != generated && std::env::var_os("FEATSHARD_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    } else {
        assert!(
            shipped == generated,
            "{} is stale: rerun with FEATSHARD_BLESS=1 ({})",
            path.display(),
            first_difference(&shipped, &generated)
        );
    }
}
