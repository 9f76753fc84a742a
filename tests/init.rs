//! `featshard init`: a draft spec from a Boltz-shaped sample, its questions answered,
//! validates and places every feature as `examples/boltz2.yaml` does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use featshard::spec::plan::{FeaturePlan, Plan};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn boltz2() -> Plan {
    featshard::spec::compile_file(&root().join("examples/boltz2.yaml"))
        .unwrap()
        .1
}

/// A Boltz-shaped inference sample: zeros, but consistent owner counts and maps.
fn write_sample(
    path: &Path,
    plan: &Plan,
    n: usize,
    counts: &[usize],
    msa: usize,
    templates: usize,
) {
    assert_eq!(counts.len(), n);
    let a: usize = counts.iter().sum();
    let first: Vec<usize> = counts
        .iter()
        .scan(0, |acc, &c| {
            let f = *acc;
            *acc += c;
            Some(f)
        })
        .collect();
    let with_atoms: Vec<usize> = (0..n).filter(|&t| counts[t] > 0).collect();
    let rset: Vec<usize> = with_atoms.iter().copied().step_by(2).collect();
    let mut len: BTreeMap<&str, usize> = [
        ("tokens", n),
        ("atoms", a),
        ("rset", rset.len()),
        ("msa", msa),
        ("ensemble", 2),
        ("disto_ensemble", 1),
        ("templates", templates),
    ]
    .into();
    // Constraint lists: empty, as when the featurizer has no constraints to give.
    for s in plan.semantics.keys() {
        len.entry(s.as_str()).or_insert(0);
    }
    let mut data: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for name in &plan.workflows["inference"] {
        let FeaturePlan::Tensor(t) = &plan.features[name] else {
            continue;
        };
        if t.derived.is_some() {
            continue; // the pipeline makes it; a featurizer does not emit it
        }
        let shape: Vec<usize> = t
            .axes
            .iter()
            .map(|x| {
                x.semantic
                    .as_deref()
                    .map_or_else(|| x.size.unwrap() as usize, |s| len[s])
            })
            .collect();
        let (dtype, size) = match t.dtype.name() {
            "bool" => (Dtype::BOOL, 1),
            "int64" => (Dtype::I64, 8),
            "float32" => (Dtype::F32, 4),
            other => panic!("unexpected dtype {other}"),
        };
        let numel: usize = shape.iter().product();
        data.insert(name.clone(), (dtype, shape, vec![0u8; numel * size]));
    }
    let set = |data: &mut BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>,
               name: &str,
               idx: usize,
               v: i64| {
        let bytes = &mut data.get_mut(name).unwrap().2;
        bytes[idx * 8..idx * 8 + 8].copy_from_slice(&v.to_le_bytes());
    };
    for (t, &c) in counts.iter().enumerate() {
        set(&mut data, "atom_counts_per_token", t, c as i64);
        set(&mut data, "token_index", t, t as i64);
    }
    let mut atom = 0;
    for (t, &c) in counts.iter().enumerate() {
        for _ in 0..c {
            set(&mut data, "atom_to_token", atom * n + t, 1);
            atom += 1;
        }
        if c > 0 {
            set(&mut data, "token_to_rep_atom", t * a + first[t], 1);
        }
    }
    for (r, &t) in rset.iter().enumerate() {
        set(&mut data, "r_set_to_rep_atom", r * a + first[t], 1);
    }
    let views: Vec<(String, TensorView)> = data
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn init(sample: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_featshard"))
        .arg("init")
        .arg("--from")
        .arg(sample)
        .args([
            "--tokens",
            "token_index",
            "--atoms",
            "ref_pos",
            "--msa",
            "msa",
        ])
        .args([
            "--rset",
            "r_set_to_rep_atom",
            "--ensemble",
            "coords",
            "--templates",
            "template_mask",
        ])
        .args(["--module", "draft"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Replaces each `QUESTION(...)` axis with the semantic `examples/boltz2.yaml` gives it.
fn answer(draft: &str, plan: &Plan) -> String {
    draft
        .lines()
        .map(|line| {
            let Some(start) = line.find("axes: [").filter(|_| line.contains("QUESTION(")) else {
                return line.to_owned();
            };
            let name = line.trim().split(':').next().unwrap();
            let FeaturePlan::Tensor(t) = &plan.features[name] else {
                panic!("{name}")
            };
            let open = start + "axes: [".len();
            let close = open + line[open..].find(']').unwrap();
            let axes: Vec<String> = line[open..close]
                .split(", ")
                .enumerate()
                .map(|(d, a)| {
                    if a.starts_with("QUESTION(") {
                        let x = &t.axes[d];
                        x.semantic
                            .clone()
                            .unwrap_or_else(|| x.size.unwrap().to_string())
                    } else {
                        a.to_owned()
                    }
                })
                .collect();
            let mut line = format!("{}{}{}", &line[..open], axes.join(", "), &line[close..]);
            // An index of a questioned axis names a questioned semantic too.
            if let (Some(at), featshard::spec::ir::Role::Index(ix)) =
                (line.find("of: QUESTION("), &t.role)
            {
                let end = at + line[at..].find(')').unwrap() + 1;
                line.replace_range(at..end, &format!("of: {}", ix.of));
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The draft validates, and every feature it shares with the example is placed alike;
/// it has every tensor feature of the example that a featurizer emits.
fn assert_same_placements(draft: &str, plan: &Plan) -> Plan {
    let (_, ours) = featshard::spec::compile_str("draft.yaml", draft)
        .unwrap_or_else(|d| panic!("draft does not validate:\n{}\n{draft}", d.render_plain()));
    for name in &plan.workflows["inference"] {
        let FeaturePlan::Tensor(b) = &plan.features[name] else {
            continue;
        };
        let Some(FeaturePlan::Tensor(a)) = ours.features.get(name) else {
            assert!(
                b.optional || b.derived.is_some(),
                "{name} is missing from the draft"
            );
            continue;
        };
        assert_eq!(a.placements, b.placements, "{name}");
    }
    ours
}

#[test]
fn a_draft_without_ambiguities_validates_and_places_as_the_example() {
    let plan = boltz2();
    let dir = tempfile::tempdir().unwrap();
    let sample = dir.path().join("sample.safetensors");
    // 11 tokens all with atoms: 6 R-set rows (no length equals a channel size).
    write_sample(&sample, &plan, 11, &[3, 1, 2, 5, 1, 2, 2, 4, 2, 1, 3], 7, 9);
    let draft = init(&sample);
    let open_questions = draft
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .any(|l| l.contains("QUESTION("));
    assert!(!open_questions, "{draft}");
    assert!(
        draft.contains(
            "atoms: {shard: true, owner: tokens, counts: atom_counts_per_token, map: atom_to_token}"
        ),
        "{draft}"
    );
    assert!(
        draft.contains("rset: {shard: true, owner: atoms, map: r_set_to_rep_atom}"),
        "{draft}"
    );
    let _ = assert_same_placements(&draft, &plan);
    // Either topology: with its mesh line changed, the draft places as the example does
    // on one CP axis (MSA rows whole, tokens on cp).
    assert!(
        draft.contains("msa: {shard: true, on_1d: whole}"),
        "{draft}"
    );
    let one_axis = |t: &str| t.replacen("cp: [cp_axis_0, cp_axis_1]", "cp: [cp]", 1);
    let example = std::fs::read_to_string(root().join("examples/boltz2.yaml")).unwrap();
    let (_, plan_1d) = featshard::spec::compile_str("boltz2.yaml", &one_axis(&example)).unwrap();
    assert_eq!(plan_1d.mesh.axes(), ["cp"]);
    let _ = assert_same_placements(&one_axis(&draft), &plan_1d);
}

#[test]
fn equal_token_and_atom_counts_are_questions_not_guesses() {
    let plan = boltz2();
    let dir = tempfile::tempdir().unwrap();
    let sample = dir.path().join("sample.safetensors");
    // 13 tokens and 13 atoms: every such axis is a question.
    write_sample(
        &sample,
        &plan,
        13,
        &[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 0, 0],
        7,
        9,
    );
    let draft = init(&sample);
    assert!(
        draft.contains("  ref_pos: {axes: [atoms, 3]"),
        "the anchor axis is known:\n{draft}"
    );
    assert!(
        draft.contains("  res_type: {axes: [QUESTION(tokens|atoms), 33]"),
        "{draft}"
    );
    assert!(
        draft.contains("# QUESTION res_type: axis 0 has length 13"),
        "{draft}"
    );
    // An open question is reported as one, at its line and column, with its choices:
    // never as a YAML syntax error.
    let errors = match featshard::spec::compile_str("draft.yaml", &draft) {
        Ok(_) => panic!("a draft with open questions must not validate"),
        Err(d) => d.render_plain(),
    };
    let (line, text) = draft
        .lines()
        .enumerate()
        .find(|(_, l)| l.starts_with("  res_type: {axes: [QUESTION("))
        .expect("the question's line");
    let column = 1 + text.find("QUESTION(").expect("the question");
    let at = format!("draft.yaml:{}:{column}:", line + 1);
    assert!(
        errors.lines().any(|l| l.contains(&at)
            && l.contains("this question is unanswered: `QUESTION(tokens|atoms)`")),
        "{errors}"
    );
    assert!(errors.contains("write one of tokens, atoms"), "{errors}");
    assert!(!errors.contains("invalid YAML"), "{errors}");
    let _ = assert_same_placements(&answer(&draft, &plan), &plan);
}

/// The questions a user answers for the real Boltz-2 output, the way the example spec
/// does: every questioned axis as the example has it, `atom_pad_mask` as the mask of
/// real atoms, and the keys the example drops under `drop:`.
#[cfg(feature = "runtime")]
fn answer_real(draft: &str, plan: &Plan) -> String {
    let mut dropped = Vec::new();
    let kept: Vec<String> = draft
        .lines()
        .filter(|line| {
            let name = line.trim().split(':').next().unwrap_or("");
            let is_feature =
                line.starts_with("  ") && !line.starts_with("  #") && line.contains("{axes:");
            if is_feature && !plan.features.contains_key(name) {
                dropped.push(name.to_owned());
                return false;
            }
            true
        })
        .map(|l| {
            l.replace(
                "{mask: QUESTION(atom_pad_mask|atom_resolved_mask)}",
                "{mask: atom_pad_mask}",
            )
            .replace(
                "atom_pad_mask: {axes: [atoms], dtype: float32}",
                "atom_pad_mask: {axes: [atoms], dtype: float32, mask: atoms}",
            )
        })
        .collect();
    // The distogram ensemble is a semantic `init` does not know: declared by hand.
    let answered = answer(&kept.join("\n"), plan).replace(
        "semantics:\n",
        "semantics:\n  disto_ensemble: {shard: false}\n",
    );
    format!("{answered}\ndrop: [{}]\n", dropped.join(", "))
}

#[cfg(feature = "runtime")]
#[test]
fn a_draft_from_real_featurizer_output_once_answered_shards_that_sample() {
    let plan = boltz2();
    let sample = root().join("tests/data/real/prot60_smiles.safetensors");
    let draft = init(&sample);
    // What it proposes from the values it sees.
    for proposal in [
        "incoming_pads: {mask: atom_pad_mask}, owner: tokens, map: atom_to_token}",
        "rset: {shard: true, owner: atoms, map: r_set_to_rep_atom}",
        "rdkit_bounds: {shard: false}  # proposed: a list of length 78",
        "rdkit_bounds_index: {axes: [2, rdkit_bounds], dtype: int64, pad: -1, index: {of: atoms, scope: padded_global}}",
        "rdkit_upper_bounds: {axes: [rdkit_bounds], dtype: float32}",
        "connected_chain_index: {axes: [2, connected_chain], dtype: int64, pad: -1}",
    ] {
        assert!(draft.contains(proposal), "no `{proposal}` in:\n{draft}");
    }
    // One-hot rows are proposed one-hot along their channel axis; other values are not.
    let line = |name: &str| {
        let start = format!("  {name}: {{");
        let found = draft.lines().find(|l| l.starts_with(&start));
        found.unwrap_or_else(|| panic!("no {name} in:\n{draft}"))
    };
    assert!(
        line("ref_atom_name_chars").ends_with("dtype: int64, one_hot: 2}"),
        "{draft}"
    );
    assert!(
        line("disto_target").ends_with("dtype: float32, one_hot: 3}"),
        "{draft}"
    );
    for plain in ["ref_pos", "ref_charge", "frames_idx"] {
        assert!(!line(plain).contains("one_hot"), "{}", line(plain));
    }
    // Nearly empty pair features are proposed sparse; dense ones and MSA features not.
    for sparse in ["token_bonds", "type_bonds", "contact_threshold"] {
        assert!(line(sparse).ends_with("sparse: true}"), "{}", line(sparse));
    }
    for dense in ["has_deletion", "ref_pos", "profile"] {
        assert!(!line(dense).contains("sparse"), "{}", line(dense));
    }
    assert!(featshard::spec::compile_str("draft.yaml", &draft).is_err());
    let answered = answer_real(&draft, &plan);
    assert!(
        answered.contains("drop: [ensemble_ref_idxs, token_to_center_atom]"),
        "{answered}"
    );
    let ours = assert_same_placements(&answered, &plan);
    let features: featshard::runtime::Features = featshard::tch::Tensor::read_safetensors(&sample)
        .unwrap()
        .into_iter()
        .collect();
    let padded = featshard::runtime::pad(
        &ours,
        featshard::spec::Mesh::new(&[2, 3]).unwrap(),
        &features,
        &Default::default(),
    )
    .unwrap_or_else(|e| panic!("the answered draft does not shard the sample: {e}"));
    assert_eq!(
        padded.layout.sizes["atoms"], 481,
        "the incoming atom pads are dropped"
    );
}

/// Both real Boltz-2 samples: the draft, its questions answered as the example answers
/// them, is flagged by nothing against the sample it was drafted from.
#[cfg(feature = "runtime")]
#[test]
fn answered_drafts_of_real_boltz_samples_are_flagged_by_nothing() {
    let plan = boltz2();
    for name in ["prot60_nomsa", "prot60_smiles"] {
        let sample = root().join(format!("tests/data/real/{name}.safetensors"));
        let answered = answer_real(&init(&sample), &plan);
        let (clean, said) = flagged_by_nothing(&answered, &sample);
        assert!(clean, "{name}: {said}\n{answered}");
    }
}

#[test]
fn a_feature_that_is_the_outer_product_of_a_mask_is_proposed_as_derived() {
    let plan = boltz2();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sample.safetensors");
    let mask = [1.0f32, 1.0, 0.0, 1.0];
    let pair: Vec<f32> = (0..16).map(|k| mask[k / 4] * mask[k % 4]).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (m, p) = (bytes(&mask), bytes(&pair));
    let views = vec![
        (
            "token_pad_mask".to_owned(),
            TensorView::new(Dtype::F32, vec![4], &m).unwrap(),
        ),
        (
            "token_pair_pad_mask".to_owned(),
            TensorView::new(Dtype::F32, vec![4, 4], &p).unwrap(),
        ),
    ];
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    let _ = plan;
    let out = Command::new(env!("CARGO_BIN_EXE_featshard"))
        .args(["init", "--from"])
        .arg(&path)
        .args(["--tokens", "token_pad_mask"])
        .output()
        .unwrap();
    let draft = String::from_utf8(out.stdout).unwrap();
    assert!(
        draft.contains(
            "token_pair_pad_mask: {axes: [tokens, tokens], dtype: float32, mask: tokens, derive: {outer: [token_pad_mask]}}"
        ),
        "{draft}"
    );
    featshard::spec::compile_str("draft.yaml", &draft)
        .unwrap_or_else(|d| panic!("{}\n{draft}", d.render_plain()));
}

#[test]
fn a_tensor_name_or_metadata_key_that_is_not_a_spec_name_never_becomes_yaml() {
    use safetensors::tensor::{SafeTensors, TensorView};
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(root().join("tests/data/real/prot60_smiles.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let evil = "zzz: {axes: [tokens], dtype: int64}\nother_keys: pass\n#";
    let one = 7i64.to_le_bytes();
    let mut views: Vec<(String, TensorView)> = st.tensors();
    views.push((
        evil.to_owned(),
        TensorView::new(safetensors::Dtype::I64, vec![1], &one).unwrap(),
    ));
    let meta: std::collections::HashMap<String, String> =
        [(format!("{evil}2"), "x".to_owned())].into();
    let path = dir.path().join("evil.safetensors");
    std::fs::write(&path, safetensors::serialize(views, Some(meta)).unwrap()).unwrap();
    let draft = init(&path);
    let doc: serde_json::Value = serde_saphyr::from_str(&draft).unwrap();
    assert!(doc.get("other_keys").is_none(), "{draft}");
    assert!(doc["features"].get("zzz").is_none(), "{draft}");
    assert!(draft.contains("# left out: \"zzz: {axes"), "{draft}");
}

#[test]
fn a_flag_of_some_real_items_is_never_proposed_as_a_pad_mask() {
    // AlphaFold3-shaped: 10 tokens, the last two an ion and a ligand without frames;
    // 30 atoms, the last ten a ligand's. `is_protein` is 1 on the first 20 atoms and
    // `has_frame` on the first 8 tokens: prefixes, but of real items, which own and
    // are owned in `atom_to_token`. `pad_like` is such a prefix with no flag's name.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("af3.safetensors");
    let (n, a) = (10usize, 30usize);
    let f32s = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let prefix =
        |len: usize, ones: usize| f32s((0..len).map(|i| f32::from(u8::from(i < ones))).collect());
    let token_of = |i: usize| {
        if i < 20 {
            i * 8 / 20
        } else if i < 29 {
            9
        } else {
            8
        }
    };
    let map = f32s(
        (0..a * n)
            .map(|k| f32::from(u8::from(token_of(k / n) == k % n)))
            .collect(),
    );
    let index: Vec<u8> = (0..n as i64).flat_map(|i| i.to_le_bytes()).collect();
    let pos = vec![0u8; a * 3 * 4];
    let (is_protein, has_frame, pad_like) = (prefix(a, 20), prefix(n, 8), prefix(a, 25));
    let views = vec![
        (
            "token_index".to_owned(),
            TensorView::new(Dtype::I64, vec![n], &index).unwrap(),
        ),
        (
            "ref_pos".to_owned(),
            TensorView::new(Dtype::F32, vec![a, 3], &pos).unwrap(),
        ),
        (
            "atom_to_token".to_owned(),
            TensorView::new(Dtype::F32, vec![a, n], &map).unwrap(),
        ),
        (
            "is_protein".to_owned(),
            TensorView::new(Dtype::F32, vec![a], &is_protein).unwrap(),
        ),
        (
            "has_frame".to_owned(),
            TensorView::new(Dtype::F32, vec![n], &has_frame).unwrap(),
        ),
        (
            "pad_like".to_owned(),
            TensorView::new(Dtype::F32, vec![a], &pad_like).unwrap(),
        ),
    ];
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_featshard"))
        .args(["init", "--from"])
        .arg(&path)
        .args(["--tokens", "token_index", "--atoms", "ref_pos"])
        .output()
        .unwrap();
    let draft = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!draft.contains("incoming_pads"), "{draft}");
    assert!(!draft.contains("a mask of the real items"), "{draft}");
}

/// A real AlphaFold3-family sample (Protenix 2.0.0's featurizer), no anchor given: the
/// lengths come from the usual keys; the token id per atom is proposed as the atoms'
/// owner map and `frame_atom_index` as atom ids with -1 for none; a channel of 4 is not
/// taken for the 4 templates nor a `[1]` for the one MSA row; the nested dict's
/// features keep their paths; no flag is proposed as a pad mask. The draft validates
/// with no question, and every feature is placed and remapped as
/// `examples/protenix.yaml` places it.
#[test]
fn a_draft_of_an_alphafold3_family_sample_needs_no_answer() {
    let draft = draft_of(&root().join("tests/data/protenix/small_complex.safetensors"));
    for line in [
        "atoms: {shard: true, owner: tokens, map: atom_to_token_idx}",
        "atom_to_token_idx: {axes: [atoms], dtype: int64, pad: -1, index: {of: tokens, scope: shard_local}}",
        "frame_atom_index: {axes: [tokens, 3], dtype: int64, pad: -1, index: {of: atoms, scope: padded_global, none: -1}}",
        "ref_atom_name_chars: {axes: [atoms, 4, 64]",
        "resolution: {axes: [1], dtype: float32}",
        "constraint_feature.contact: {axes: [tokens, tokens, 2]",
        // No mask of the real items in the sample: the pipeline's, as the example's.
        "token_mask: {axes: [tokens], dtype: bool, mask: tokens, derive: {valid: true}}",
        "atom_mask: {axes: [atoms], dtype: bool, mask: atoms, derive: {valid: true}}",
        // The MSA's residue classes are restype's; its gap class is the user's to say.
        "msa: {axes: [msa, tokens], dtype: int64, range: [0, 31]}",
        "# proposed: msa holds classes of restype (0 to 31)",
        "pair_mask: {axes: [tokens, tokens], dtype: bool, mask: tokens, derive: {valid: true}}",
    ] {
        assert!(draft.contains(line), "{line}\n{draft}");
    }
    let open = |l: &&str| !l.trim_start().starts_with('#') && l.contains("QUESTION");
    assert!(!draft.lines().any(|l| open(&l)), "{draft}");
    assert!(!draft.contains("incoming_pads"), "{draft}");
    let sample = root().join("tests/data/protenix/small_complex.safetensors");
    let (clean, said) = flagged_by_nothing(&draft, &sample);
    assert!(clean, "{said}\n{draft}");
    let (_, ours) = featshard::spec::compile_str("draft.yaml", &draft)
        .unwrap_or_else(|d| panic!("{}\n{draft}", d.render_plain()));
    // The example lays its atoms out in windows, a choice of the model a sample cannot
    // tell: the draft is held to it in owner blocks.
    let text = std::fs::read_to_string(root().join("examples/protenix.yaml")).unwrap();
    let owner_blocks: String = text
        .lines()
        .filter(|l| !l.contains("derive: {halo:") && !l.contains("layout: windows"))
        .map(|l| format!("{l}\n"))
        .collect();
    let (_, example) = featshard::spec::compile_str("protenix.yaml", &owner_blocks).unwrap();
    for (name, f) in &example.features {
        let FeaturePlan::Tensor(b) = f else { continue };
        if b.derived.is_some() {
            continue;
        }
        let Some(FeaturePlan::Tensor(a)) = ours.features.get(name) else {
            panic!("{name} is missing from the draft");
        };
        assert_eq!(
            (&a.placements, &a.remap),
            (&b.placements, &b.remap),
            "{name}"
        );
    }
}

/// `featshard init --from sample` with no anchor: the draft.
fn draft_of(sample: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_featshard"))
        .args(["init", "--from"])
        .arg(sample)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    String::from_utf8(out.stdout).unwrap()
}

/// The real Protenix sample changed as a hostile census changed it: `edit` gets every
/// tensor as (key, dtype, shape, little-endian bytes) and may change, drop or rename.
fn protenix_variant(
    dir: &Path,
    name: &str,
    edit: impl Fn(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>),
) -> PathBuf {
    let bytes =
        std::fs::read(root().join("tests/data/protenix/small_complex.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(k, v)| (k, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(k, d, s, b)| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let path = dir.join(format!("{name}.safetensors"));
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    path
}

fn set_i64(tensors: &mut [(String, Dtype, Vec<usize>, Vec<u8>)], key: &str, at: usize, v: i64) {
    let t = tensors.iter_mut().find(|t| t.0 == key).unwrap();
    t.3[at * 8..at * 8 + 8].copy_from_slice(&v.to_le_bytes());
}

/// Drafts that once shard-refused their own sample: a 0/1 atom feature 1 on a prefix
/// whose later atoms have tokens (`ref_mask`: a flag, never the atoms' pad mask); an atom
/// of no token (id -1: `unowned_rows: pad`, the frames into the atoms renumbered); keys
/// joined by `/` (`separator: "/"`, never dropped). Each draft, with no question open,
/// shards the sample it was drafted from.
#[test]
fn a_draft_shards_the_sample_it_was_drafted_from() {
    let dir = tempfile::tempdir().unwrap();
    let atoms = 177;
    let flag = protenix_variant(dir.path(), "flag", |t| {
        t.retain(|x| {
            ["token_index", "atom_to_token_idx", "ref_pos", "ref_mask"].contains(&x.0.as_str())
        });
        for a in atoms - 3..atoms {
            set_i64(t, "ref_mask", a, 0);
        }
    });
    let unowned = protenix_variant(dir.path(), "unowned", |t| {
        set_i64(t, "atom_to_token_idx", atoms - 1, -1)
    });
    let slashed = protenix_variant(dir.path(), "slashed", |t| {
        for x in t.iter_mut() {
            x.0 = x.0.replace('.', "/");
        }
    });
    for (sample, wanted) in [
        (&flag, "ref_mask: {axes: [atoms], dtype: int64}"),
        (&unowned, "map: atom_to_token_idx, unowned_rows: pad}"),
        (&slashed, "separator: \"/\""),
    ] {
        let draft = draft_of(sample);
        assert!(draft.contains(wanted), "{wanted}\n{draft}");
        assert!(!draft.contains("incoming_pads"), "{draft}");
        assert!(!draft.contains("left out"), "{draft}");
        let open = |l: &&str| !l.trim_start().starts_with('#') && l.contains("QUESTION");
        assert!(!draft.lines().any(|l| open(&l)), "{draft}");
        let spec = dir.path().join("draft.yaml");
        std::fs::write(&spec, &draft).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_featshard"))
            .args(["shard"])
            .arg(&spec)
            .arg("--features")
            .arg(sample)
            .args(["--mesh", "2x2", "--out"])
            .arg(dir.path().join(sample.file_stem().unwrap()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}\n{draft}",
            sample.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `featshard validate SPEC --features SAMPLE`: whether the check found nothing and
/// featshard takes the sample, and what it said.
fn flagged_by_nothing(spec: &str, sample: &Path) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("draft.yaml");
    std::fs::write(&path, spec).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_featshard"))
        .arg("validate")
        .arg(&path)
        .arg("--features")
        .arg(sample)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let clean = out.status.success() && said.contains("no findings; taken");
    (clean, said + &String::from_utf8_lossy(&out.stderr))
}

/// OpenFold3's real output in its three forms (tests/data/openfold3), no anchor and no
/// answer: the token id per atom is the atoms' owner map, each token's first atom atom
/// ids (`start_atom_index`), the featurizer's own `token_mask`, `atom_mask` and
/// `msa_mask` masks; the token budget's pads are incoming pads of `token_mask`, the
/// collator's atom pads those of `atom_mask` with the map's pad id 0. Each draft is
/// flagged by nothing against its sample, and places, remaps and takes the sample's pads
/// as `examples/openfold3.yaml` does (its `[1]` settings scalars for the collated form).
#[test]
fn drafts_of_openfold3_samples_in_every_form_are_right_by_meaning() {
    let text = std::fs::read_to_string(root().join("examples/openfold3.yaml")).unwrap();
    for form in ["plain", "padded", "collated"] {
        let sample = root().join(format!("tests/data/openfold3/{form}.safetensors"));
        let draft = draft_of(&sample);
        for line in [
            "atom_to_token_index: {axes: [atoms], dtype: int32, pad: -1, index: {of: tokens, scope: shard_local}}",
            "start_atom_index: {axes: [tokens], dtype: int32, index: {of: atoms, scope: padded_global}}",
            "token_mask: {axes: [tokens], dtype: float32, mask: tokens}",
            "atom_mask: {axes: [atoms], dtype: float32, mask: atoms}",
            "msa_mask: {axes: [msa, tokens], dtype: float32, mask: [msa, tokens]}",
        ] {
            assert!(draft.contains(line), "{form}: no `{line}` in\n{draft}");
        }
        let open = |l: &&str| !l.trim_start().starts_with('#') && l.contains("QUESTION");
        assert!(!draft.lines().any(|l| open(&l)), "{form}:\n{draft}");
        let (clean, said) = flagged_by_nothing(&draft, &sample);
        assert!(clean, "{form}: {said}\n{draft}");
        let example = match form {
            "collated" => text.replace("axes: [1]", "axes: []"),
            _ => text.clone(),
        };
        let (_, example) = featshard::spec::compile_str("openfold3.yaml", &example).unwrap();
        let (_, ours) = featshard::spec::compile_str("draft.yaml", &draft).unwrap();
        for (name, f) in &example.features {
            let FeaturePlan::Tensor(b) = f else { continue };
            let Some(FeaturePlan::Tensor(a)) = ours.features.get(name) else {
                panic!("{form}: {name} is missing from the draft");
            };
            let role = |t: &featshard::spec::plan::TensorPlan| format!("{:?}", t.role);
            assert_eq!(
                (&a.placements, &a.remap, role(a)),
                (&b.placements, &b.remap, role(b)),
                "{form}: {name}"
            );
        }
        for s in ["tokens", "atoms"] {
            let (a, b) = (&ours.semantics[s], &example.semantics[s]);
            let pads = |x: &featshard::spec::plan::SemanticPlan| match form {
                "plain" => None,
                _ => x.incoming.clone().map(|i| (i, x.incoming_map_pad)),
            };
            let wanted = match (form, s) {
                ("plain", _) | ("padded", "atoms") => None,
                _ => pads(b),
            };
            assert_eq!(pads(a), wanted, "{form}: {s}'s incoming pads");
            assert_eq!(a.owned_by, b.owned_by, "{form}: {s}'s owners");
        }
    }
}
