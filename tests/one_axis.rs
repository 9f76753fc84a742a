//! One-axis context parallelism `(cp,)` from the same spec: the placements the one
//! inference derives against Boltz-CP's 1-D registry, what cannot be placed on one axis
//! (refused by name, with the YAML line and column), and meshes given with the wrong
//! number of axes or dimension names (refused by name, nothing written).

mod support;

use std::collections::BTreeMap;

use featshard_spec::compile_str;
use featshard_spec::ir::Placement;
use featshard_spec::plan::{MeshDims, Padding};
use support::cli::{featshard, root, spec, spec_1d};
use support::errors_of;

/// Boltz-CP's 1-D placement registry (`placements_1d.py`: one placement per feature on
/// the CP sub-mesh `(cp,)`), as data: `Some(d)` is `Shard(d)`, `None` `Replicate()`.
fn boltz_cp_registry(workflow: &str) -> BTreeMap<&'static str, Option<usize>> {
    let row_sharded = [
        "ref_pos",
        "ref_charge",
        "atom_resolved_mask",
        "ref_element",
        "ref_atom_name_chars",
        "ref_space_uid",
        "atom_counts_per_token",
        "atom_pad_mask",
        "atom_to_token",
        "token_to_rep_atom",
        "r_set_to_rep_atom",
        "ref_chirality",
        "atom_backbone_feat",
        "bfactor",
        "plddt",
        "token_index",
        "residue_index",
        "asym_id",
        "entity_id",
        "sym_id",
        "mol_type",
        "res_type",
        "disto_center",
        "disto_target",
        "token_bonds",
        "type_bonds",
        "token_pad_mask",
        "token_resolved_mask",
        "token_disto_mask",
        "token_pair_pad_mask",
        "pair_mask",
        "contact_conditioning",
        "contact_threshold",
        "cyclic_period",
        "modified",
        "deletion_mean",
        "profile",
    ];
    let token_axis_1 = [
        "coords",
        "frame_resolved_mask",
        "frames_idx",
        "disto_coords_ensemble",
        "msa",
        "msa_paired",
        "deletion_value",
        "has_deletion",
        "msa_mask",
    ];
    let mut r: BTreeMap<&str, Option<usize>> = row_sharded.iter().map(|&f| (f, Some(0))).collect();
    r.extend(token_axis_1.iter().map(|&f| (f, Some(1))));
    r.insert("method_feature", None);
    match workflow {
        "training" => r.extend([("temp_feature", None), ("ph_feature", None)]),
        _ => r.extend([("affinity_token_mask", Some(0))]),
    }
    r
}

fn one_axis_text() -> String {
    std::fs::read_to_string(spec_1d()).unwrap()
}

/// The shipped spec with its `mesh:` line changed gives Boltz-CP's 1-D placements on
/// every key both have, in both workflows, but for the three features Boltz-CP labels
/// scalars while the featurizer emits them per token (see docs/spec.md).
#[test]
fn the_one_axis_placements_are_boltz_cps_1d_registry() {
    let two = std::fs::read_to_string(root().join("examples/boltz2.yaml")).unwrap();
    let one = one_axis_text();
    let changed: Vec<_> = two
        .lines()
        .zip(one.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(
        changed,
        vec![("  cp: [cp_axis_0, cp_axis_1]", "  cp: [cp]")]
    );
    let (_, plan) = compile_str("boltz2_1d.yaml", &one).unwrap();
    assert_eq!(plan.mesh.axes(), ["cp"]);
    for workflow in ["training", "inference"] {
        let registry = boltz_cp_registry(workflow);
        let mut differ = Vec::new();
        let mut compared = 0;
        for name in &plan.workflows[workflow] {
            let (Some(t), Some(want)) = (plan.tensor(name), registry.get(name.as_str())) else {
                continue;
            };
            compared += 1;
            let want = vec![want.map_or(Placement::Replicate, Placement::Shard)];
            if t.placements != want {
                differ.push(name.as_str());
            }
        }
        let expected: &[&str] = match workflow {
            "training" => &["method_feature", "ph_feature", "temp_feature"],
            _ => &["method_feature"],
        };
        assert_eq!(differ, expected, "{workflow}");
        // Every key of the registry is a feature of the workflow.
        assert_eq!(compared, registry.len(), "{workflow}");
    }
    // Those three are `[tokens]` in the featurizer's output: Shard(0), as any token feature.
    assert_eq!(
        plan.tensor("method_feature").unwrap().placements,
        [Placement::Shard(0)]
    );
    // Owned items lie in serial order on one axis, padded to a multiple of the window
    // too; their maps keep global columns (no diagonal block, no shard-local ids).
    assert_eq!(
        plan.semantics["atoms"].padding,
        Padding::Multiple {
            mesh_axes: vec![0],
            window: Some(32),
            whole_windows: false,
        }
    );
    let a2t = plan.tensor("atom_to_token").unwrap();
    assert_eq!(a2t.remap, featshard_spec::plan::Remap::None);
    assert_eq!(
        a2t.placements_dp,
        [Placement::Shard(0), Placement::Shard(1)]
    );
}

const ONE_AXIS: &str = "\
version: 1
module: demo
mesh: {cp: [cp], dp: dp}
semantics:
  tokens: {shard: true}
  msa: {shard: true}
features:
  pair: {axes: [tokens, tokens, 4], dtype: float32}
  single: {axes: [tokens], dtype: float32}
";

#[test]
fn two_sharded_semantics_competing_for_the_one_axis_are_refused_by_name() {
    let err = errors_of(&format!(
        "{ONE_AXIS}  rows: {{axes: [msa, tokens], dtype: int64}}\n"
    ));
    assert!(err.contains("spec.yaml:10:"), "{err}");
    assert!(err.contains("feature `rows`"), "{err}");
    assert!(
        err.contains("axis 0 (`msa`) and axis 1 (`tokens`) are both sharded"),
        "{err}"
    );
    assert!(err.contains("on_1d: whole"), "{err}");
    // Declared: MSA rows stay whole and tokens take the axis, as Boltz-CP's 1-D model reads
    // them; on a 2-D tile the declaration changes nothing.
    let declared = ONE_AXIS.replace("msa: {shard: true}", "msa: {shard: true, on_1d: whole}")
        + "  rows: {axes: [msa, tokens], dtype: int64}\n";
    let (_, plan) = compile_str("spec.yaml", &declared).unwrap();
    assert_eq!(
        plan.tensor("rows").unwrap().placements,
        [Placement::Shard(1)]
    );
    assert_eq!(
        plan.tensor("pair").unwrap().placements,
        [Placement::Shard(0)]
    );
    let tile = declared.replace("cp: [cp]", "cp: [cp0, cp1]");
    let (_, plan) = compile_str("spec.yaml", &tile).unwrap();
    assert_eq!(
        plan.tensor("rows").unwrap().placements,
        [Placement::Shard(0), Placement::Shard(1)]
    );
}

#[test]
fn one_axis_spec_errors_name_the_line_and_column() {
    let err = errors_of(&ONE_AXIS.replace("msa: {shard: true}", "msa: {shard: true, on_1d: rows}"));
    assert!(err.contains("spec.yaml:6:"), "{err}");
    assert!(
        err.contains("semantic `msa`: unknown `on_1d` value `rows`"),
        "{err}"
    );
    let err = errors_of(&ONE_AXIS.replace("cp: [cp]", "cp: [a, b, c]"));
    assert!(err.contains("spec.yaml:3:"), "{err}");
    assert!(
        err.contains("a CP mesh has one axis `[cp]` or two `[cp0, cp1]`, 3 given"),
        "{err}"
    );
    // A 2-D placement written on a 1-D spec is refused by name.
    let err = errors_of(&format!(
        "{ONE_AXIS}  x: {{axes: [tokens], dtype: float32, placement: [\"Shard(0)\", \"Replicate()\"]}}\n"
    ));
    assert!(err.contains("feature `x`"), "{err}");
}

/// The DP axis and the CP axes of a device mesh are found by the spec's names; any
/// other naming is refused by name (a DP axis guessed from a dimension count gave two
/// replicas the same samples).
#[test]
fn device_mesh_dimensions_are_found_by_the_specs_names() {
    let (_, plan) = compile_str("spec.yaml", ONE_AXIS).unwrap();
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let dims = |n: &[&str]| plan.mesh.dims(Some(&names(n)), n.len());
    assert_eq!(
        dims(&["dp", "cp"]),
        Ok(MeshDims {
            dp: Some(0),
            sample: vec![1]
        })
    );
    assert_eq!(
        dims(&["cp"]),
        Ok(MeshDims {
            dp: None,
            sample: vec![0]
        })
    );
    assert_eq!(
        plan.mesh.dims(None, 1),
        Ok(MeshDims {
            dp: None,
            sample: vec![0]
        })
    );
    let err = dims(&["dp", "cp0"]).unwrap_err();
    assert!(
        err.contains("dimension `cp0` is not an axis of the spec's mesh (dp, cp)"),
        "{err}"
    );
    // How to match: the device mesh named as the spec says, or the spec as the mesh.
    assert!(
        err.ends_with(
            "name the device mesh's dimensions as the spec does (`mesh_dim_names=(\"dp\", \"cp\",)`), or the spec's mesh as the model names it (`mesh: {cp: [cp0], dp: dp}`)"
        ),
        "{err}"
    );
    let err = dims(&["cp", "dp"]).unwrap_err();
    assert!(
        err.contains("(cp, dp) are not the spec's mesh (dp, cp) in its order"),
        "{err}"
    );
    let err = plan.mesh.dims(None, 2).unwrap_err();
    assert!(err.contains("without names"), "{err}");
}

/// A spec whose semantics cannot be placed on one axis is refused by name before any
/// byte moves: `shard` writes nothing.
#[test]
fn an_unplaceable_one_axis_spec_shards_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // The shipped spec without `on_1d: whole`: MSA rows and tokens compete for the axis.
    let text = one_axis_text().replace("    on_1d: whole", "    on_1d: shard");
    assert_ne!(text, one_axis_text());
    let spec = dir.path().join("boltz2_1d.yaml");
    std::fs::write(&spec, text).unwrap();
    let out = dir.path().join("out");
    let run = featshard(&[
        "shard",
        &spec.display().to_string(),
        "--features",
        &root()
            .join("tests/data/real/prot60_smiles.safetensors")
            .display()
            .to_string(),
        "--mesh",
        "3",
        "--workflow",
        "inference",
        "--out",
        &out.display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(err.contains("feature `msa`"), "{err}");
    assert!(
        err.contains("axis 0 (`msa`) and axis 1 (`tokens`) are both sharded"),
        "{err}"
    );
    assert!(err.contains("boltz2_1d.yaml:"), "{err}");
    assert!(!out.exists(), "something was written");
}

/// `--mesh 3` on a (cp0, cp1) spec was read as 3x1; `--mesh 2x2` has no place on (cp,).
/// Both are refused by name before any byte is written.
#[test]
fn a_mesh_with_the_wrong_number_of_axes_is_refused_and_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let sample = root().join("tests/data/real/prot60_nomsa.safetensors");
    for (mesh, want) in [
        (
            "3",
            "--mesh 3: sizes [3] for the spec's mesh (cp_axis_0, cp_axis_1): one size per axis (`3x3`)",
        ),
        (
            "2x2",
            "--mesh 2x2: sizes [2, 2] for the spec's mesh (cp): one size per axis (`2`)",
        ),
    ] {
        let out_dir = dir.path().join(mesh);
        // Each mesh on the spec it does not fit.
        let spec_path = if mesh == "3" { spec() } else { spec_1d() };
        let run = featshard(&[
            "shard",
            &spec_path,
            "--features",
            &sample.display().to_string(),
            "--mesh",
            mesh,
            "--workflow",
            "inference",
            "--out",
            &out_dir.display().to_string(),
        ]);
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{err}");
        assert!(err.contains(want), "{err}");
        assert!(!out_dir.exists(), "{mesh}: something was written");
        let run = featshard(&["explain", &spec_path, "--mesh", mesh]);
        assert!(String::from_utf8_lossy(&run.stderr).contains(want));
    }
    let run = featshard(&["explain", &spec_1d(), "--mesh", "4"]);
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(text.starts_with("mesh (cp) = (4): 4 CP ranks"), "{text}");
}

/// With lengths, `explain` ends with each rank's bytes on `(cp,)` and on every tile of as
/// many ranks, the same figures from either spec (one inference, the mesh line changed).
#[test]
fn explain_puts_every_topology_of_the_rank_count_side_by_side() {
    let lengths = "tokens=256,atoms=2000,msa=64,rset=200,ensemble=1,disto_ensemble=1,templates=1";
    let table = |spec: &str, mesh: &str| {
        let run = featshard(&["explain", spec, "--mesh", mesh, "--lengths", lengths]);
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let text = String::from_utf8_lossy(&run.stdout).into_owned();
        let start = text
            .find("on every CP topology of 6 ranks")
            .expect("no topology table");
        text[start..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with('('))
            .map(|l| l.replace("this spec", "").trim_end().to_owned())
            .collect::<Vec<_>>()
    };
    let from_tile = table(&spec(), "2x3");
    let from_axis = table(&spec_1d(), "6");
    let labels: Vec<&str> = from_tile
        .iter()
        .map(|l| l.split("  ").next().unwrap())
        .collect();
    assert_eq!(
        labels,
        [
            "(cp,) = (6)",
            "(cp0, cp1) = (1, 6)",
            "(cp0, cp1) = (2, 3)",
            "(cp0, cp1) = (3, 2)",
            "(cp0, cp1) = (6, 1)"
        ]
    );
    assert_eq!(from_tile, from_axis);
    // Each row is that mesh's own plan: its per-rank bytes are what `explain` reports
    // for it alone (one row checked against the table's byte column).
    assert!(from_tile
        .iter()
        .all(|l| l.contains(" MB") || l.contains(" KB")));
}

/// A one-axis run names one axis: the manifest, every rank file's identity, the dataset
/// manifest and the messages say `cp=4`, never a second axis of size 1.
#[test]
fn a_one_axis_run_names_one_axis_in_its_files_and_messages() {
    let dir = tempfile::tempdir().unwrap();
    let sample = root().join("tests/data/real/prot60_nomsa.safetensors");
    let out = dir.path().join("out");
    let run = featshard(&[
        "shard",
        &spec_1d(),
        "--features",
        &sample.display().to_string(),
        "--mesh",
        "4",
        "--workflow",
        "inference",
        "--out",
        &out.display().to_string(),
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(run.status.success(), "{stderr}");
    assert!(stdout.contains("wrote 4 rank files (cp=4)"), "{stdout}");
    assert!(
        stderr.contains("4 rank files written (mesh cp=4)"),
        "{stderr}"
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["mesh"], serde_json::json!({"cp": 4}));
    assert_eq!(manifest["layout"]["mesh"], serde_json::json!([4]));
    let header = std::fs::read(out.join("rank-3.safetensors")).unwrap();
    let header = String::from_utf8_lossy(&header[..4096.min(header.len())]);
    assert!(header.contains(r#"\"mesh\":{\"cp\":4}"#), "{header}");
    // Read back on another mesh: refused, both meshes named by their axes.
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::copy(&sample, data.join("a.safetensors")).unwrap();
    let ds = dir.path().join("ds");
    let args = |mesh: &str| {
        vec![
            "shard".to_owned(),
            spec_1d(),
            "--features".into(),
            data.display().to_string(),
            "--mesh".into(),
            mesh.into(),
            "--workflow".into(),
            "inference".into(),
            "--out".into(),
            ds.display().to_string(),
        ]
    };
    let run = featshard(&args("4").iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let dataset: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ds.join("dataset.json")).unwrap()).unwrap();
    assert_eq!(dataset["mesh"], serde_json::json!({"cp": 4}));
    // A reader on another mesh is refused, both meshes named by their axes.
    let (_, plan) = featshard::spec::compile_file(std::path::Path::new(&spec_1d())).unwrap();
    let two = featshard::spec::Mesh::new(&[2]).unwrap();
    let err = featshard::exec::shard_folder::read_dataset(&plan, &ds, two).unwrap_err();
    assert!(
        err.contains("sharded for mesh cp=4, this mesh is cp=2"),
        "{err}"
    );
}
