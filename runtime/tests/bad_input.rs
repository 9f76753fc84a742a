//! Every class of bad sample gives its own error, naming the feature (and axis), and the
//! same error whether the sample comes as tensors (the tch runtime, which validates
//! through the byte executor's views of their memory) or as a file, memory-mapped (what
//! `featshard shard` runs).

mod common;

use featshard_runtime::{pad, Features, Options, RuntimeError};
use tch::{Kind, Tensor};

const COUNTS: [i64; 6] = [2, 1, 0, 3, 2, 1];

fn sample() -> (featshard_spec::Plan, Features) {
    let plan = common::boltz2_plan();
    let s = common::boltz_sample(&plan, &COUNTS, 3);
    (plan, s)
}

fn inference() -> Options {
    Options {
        workflow: Some("inference".into()),
        ..Options::default()
    }
}

fn error(plan: &featshard_spec::Plan, s: &Features) -> RuntimeError {
    let e = pad(plan, common::mesh(&[2, 3]), s, &inference()).expect_err("bad sample was accepted");
    // With threads for writing blocks, the error is the same.
    let threaded = Options {
        threads: 3,
        ..inference()
    };
    let t = pad(plan, common::mesh(&[2, 3]), s, &threaded)
        .expect_err("bad sample was accepted on 3 threads");
    assert_eq!(t.to_string(), e.to_string());
    let bytes = exec(plan, s).expect_err("the byte executor accepted a bad sample");
    assert_eq!(bytes, e, "tensors and file disagree");
    e
}

/// The byte executor's placement of the sample, read from a file as `featshard shard`
/// reads it.
fn exec(plan: &featshard_spec::Plan, s: &Features) -> Result<(), RuntimeError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sample.safetensors");
    featshard_runtime::files::write(&path, s, &Default::default()).unwrap();
    let mapped = featshard_exec::files::Mapped::open(&path)?;
    featshard_exec::place(plan, common::mesh(&[2, 3]), &mapped.sample(), &inference()).map(|_| ())
}

#[test]
fn the_unmodified_sample_is_accepted() {
    let (plan, s) = sample();
    pad(&plan, common::mesh(&[2, 3]), &s, &inference()).expect("valid sample");
    exec(&plan, &s).expect("valid sample, byte executor");
}

#[test]
fn a_missing_feature() {
    let (plan, mut s) = sample();
    s.remove("ref_pos");
    let e = error(&plan, &s);
    assert!(
        matches!(&e, RuntimeError::Missing { feature } if feature == "ref_pos"),
        "{e}"
    );
    assert!(e.to_string().contains("feature `ref_pos`"));
}

#[test]
fn an_unknown_feature_unless_passed_through() {
    let (plan, mut s) = sample();
    s.insert("record_id".into(), Tensor::from_slice(&[7i64]));
    let e = error(&plan, &s);
    assert!(
        matches!(&e, RuntimeError::Unknown { features, .. } if features == &["record_id".to_string()]),
        "{e}"
    );
    let opts = Options {
        passthrough: ["record_id".to_string()].into(),
        ..inference()
    };
    let padded = pad(&plan, common::mesh(&[2, 3]), &s, &opts).expect("passed through");
    assert!(padded.passthrough.contains_key("record_id"));
}

#[test]
fn a_feature_of_another_workflow() {
    let (plan, mut s) = sample();
    s.insert(
        "temp_feature".into(),
        Tensor::zeros([6], (Kind::Int64, tch::Device::Cpu)),
    );
    let e = error(&plan, &s);
    // Named as a feature of the spec's other workflow, not as a key it lacks.
    assert!(
        matches!(&e, RuntimeError::OtherWorkflow { workflow, features }
            if workflow == "inference" && features == &[("temp_feature".to_string(), vec!["training".to_string()])]),
        "{e}"
    );
}

#[test]
fn a_wrong_rank() {
    let (plan, mut s) = sample();
    s.insert("res_type".into(), s["res_type"].unsqueeze(-1));
    let e = error(&plan, &s);
    assert!(
        matches!(&e, RuntimeError::Rank { feature, expected: 2, .. } if feature == "res_type"),
        "{e}"
    );
}

/// A one-hot feature flattened to one axis of integers reads as its indices (a
/// featurizer may give them so): its length is then not the tokens', and it is refused
/// by name, never cut to fit.
#[test]
fn a_flattened_one_hot_feature_is_refused_by_its_length() {
    let (plan, mut s) = sample();
    s.insert("res_type".into(), s["res_type"].flatten(0, -1));
    let e = error(&plan, &s).to_string();
    assert!(e.contains("feature `res_type`, axis 0 (tokens"), "{e}");
    assert!(
        e.contains("every axis of `tokens` arrives with the same length"),
        "{e}"
    );
}

#[test]
fn a_wrong_dtype() {
    let (plan, mut s) = sample();
    s.insert("ref_pos".into(), s["ref_pos"].to_kind(Kind::Double));
    let e = error(&plan, &s);
    assert_eq!(
        e.to_string(),
        "feature `ref_pos`: expected dtype float32, got float64"
    );
}

#[test]
fn a_wrong_channel_size() {
    let (plan, mut s) = sample();
    s.insert("ref_pos".into(), s["ref_pos"].narrow(1, 0, 2));
    let e = error(&plan, &s);
    assert_eq!(
        e.to_string(),
        "feature `ref_pos`, axis 1 (channel): expected size 3, got 2"
    );
}

#[test]
fn unequal_lengths_of_one_semantic() {
    let (plan, mut s) = sample();
    s.insert("msa_paired".into(), s["msa_paired"].narrow(0, 0, 4));
    let e = error(&plan, &s);
    assert!(
        matches!(&e, RuntimeError::Length { feature, axis: 0, semantic, .. } if feature == "msa_paired" && semantic == "msa"),
        "{e}"
    );
}

#[test]
fn an_axis_shorter_than_the_real_items_of_a_padded_semantic() {
    // Tokens may arrive padded (the spec says so): an axis shorter than the real
    // tokens the mask counts is an error on that axis.
    let (plan, mut s) = sample();
    s.insert("token_bonds".into(), s["token_bonds"].narrow(1, 0, 5));
    let e = error(&plan, &s);
    assert!(
        matches!(&e, RuntimeError::Incoming { feature, axis: 1, semantic, .. } if feature == "token_bonds" && semantic == "tokens"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("length 5, fewer than the 6 real tokens"),
        "{e}"
    );
}

#[test]
fn an_incoming_mask_that_disagrees_with_the_counts() {
    let (plan, mut s) = sample();
    let m = s["atom_pad_mask"].copy();
    let _ = m.narrow(0, 8, 1).fill_(0); // 9 atoms; the mask now says 8 are real
    s.insert("atom_pad_mask".into(), m);
    let e = error(&plan, &s);
    assert_eq!(
        e.to_string(),
        "feature `atom_counts_per_token`, axis 0 (tokens): counts of `atoms` sum to 9, but `atom_pad_mask` marks 8 real atoms"
    );
}

#[test]
fn an_incoming_mask_with_a_real_item_after_a_pad() {
    let (plan, mut s) = sample();
    let m = s["atom_pad_mask"].copy();
    let _ = m.narrow(0, 3, 1).fill_(0);
    s.insert("atom_pad_mask".into(), m);
    let e = error(&plan, &s);
    assert!(
        matches!(&e, RuntimeError::Incoming { feature, axis: 0, semantic, .. } if feature == "atom_pad_mask" && semantic == "atoms"),
        "{e}"
    );
    assert!(
        e.to_string().contains("item 4 is real after a pad at 3"),
        "{e}"
    );
}

#[test]
fn owner_counts_that_do_not_sum_to_the_atoms() {
    let (plan, mut s) = sample();
    s.insert(
        "atom_counts_per_token".into(),
        Tensor::from_slice(&[2i64, 1, 0, 3, 2, 2]),
    );
    let e = error(&plan, &s);
    assert!(
        e.to_string().starts_with(
            "feature `atom_counts_per_token`, axis 0 (tokens): counts of `atoms` sum to 10"
        ),
        "{e}"
    );
}

#[test]
fn negative_owner_counts() {
    let (plan, mut s) = sample();
    s.insert(
        "atom_counts_per_token".into(),
        Tensor::from_slice(&[3i64, 1, -1, 3, 2, 1]),
    );
    let e = error(&plan, &s);
    assert!(e.to_string().contains("negative count -1"), "{e}");
}

#[test]
fn an_owner_map_row_without_an_owner_is_a_pad_where_the_spec_says_so() {
    let (plan, mut s) = sample();
    let m = s["r_set_to_rep_atom"].copy();
    let rows = m.size()[0] as usize;
    let _ = m.get(0).fill_(0);
    s.insert("r_set_to_rep_atom".into(), m);
    let padded =
        pad(&plan, common::mesh(&[2, 3]), &s, &inference()).expect("an unowned row is a pad");
    assert_eq!(padded.layout.sizes["rset"], rows - 1);
    assert_eq!(padded.intake.unowned["rset"], 1);
}

#[test]
fn an_owner_map_row_with_two_owners() {
    let (plan, mut s) = sample();
    let m = s["r_set_to_rep_atom"].copy();
    let _ = m.get(0).fill_(1);
    s.insert("r_set_to_rep_atom".into(), m);
    let e = error(&plan, &s);
    assert!(
        e.to_string().starts_with("feature `r_set_to_rep_atom`, axis 1 (atoms): row 0 of `rset` must have exactly one owner, has 9"),
        "{e}"
    );
}

#[test]
fn an_owner_map_that_disagrees_with_the_counts() {
    let (plan, mut s) = sample();
    // Atom 0 (token 0 by the counts) claims token 5 as its owner.
    let m = s["atom_to_token"].copy();
    let _ = m.get(0).fill_(0);
    let _ = m.get(0).get(5).fill_(1);
    s.insert("atom_to_token".into(), m);
    let e = error(&plan, &s);
    assert_eq!(
        e.to_string(),
        "feature `atom_to_token`, axis 1 (tokens): `atoms` item 0 belongs to `tokens` 5 here, but to 0 by `atom_counts_per_token`"
    );
}

#[test]
fn index_values_out_of_range() {
    let (plan, mut s) = sample();
    let f = s["frames_idx"].copy();
    let _ = f.get(0).get(0).get(0).fill_(9); // 9 atoms: valid ids are 0..8
    s.insert("frames_idx".into(), f);
    let e = error(&plan, &s);
    assert!(
        matches!(&e, RuntimeError::IndexRange { feature, semantic, max: 9, len: 9, .. } if feature == "frames_idx" && semantic == "atoms"),
        "{e}"
    );
    assert!(e
        .to_string()
        .starts_with("feature `frames_idx`: index values must lie in [0, 9) of `atoms`"));
}

#[test]
fn of_two_bad_features_the_first_by_name_is_named() {
    let (plan, mut s) = sample();
    let f = s["frames_idx"].copy();
    let _ = f.get(0).get(0).get(0).fill_(9);
    s.insert("frames_idx".into(), f);
    let m = s["token_to_rep_atom"].copy();
    let _ = m.get(0).get(1).fill_(1);
    s.insert("token_to_rep_atom".into(), m);
    let e = error(&plan, &s);
    assert!(e.to_string().starts_with("feature `frames_idx`"), "{e}");
}

#[test]
fn a_one_hot_that_is_not_one_hot() {
    let (plan, mut s) = sample();
    let m = s["token_to_rep_atom"].copy();
    let _ = m.get(0).get(1).fill_(1); // token 0 now has two representative atoms
    s.insert("token_to_rep_atom".into(), m);
    let e = error(&plan, &s);
    assert!(
        matches!(&e, RuntimeError::OneHot { feature, axis: 1, .. } if feature == "token_to_rep_atom"),
        "{e}"
    );
}

#[test]
fn a_map_entry_outside_its_diagonal_block() {
    let (plan, mut s) = sample();
    // Token 0 (first shard) takes the last atom (token 5's, last shard) as its
    // representative.
    let m = s["token_to_rep_atom"].copy();
    let _ = m.get(0).fill_(0);
    let _ = m.get(0).get(8).fill_(1);
    s.insert("token_to_rep_atom".into(), m);
    let e = error(&plan, &s);
    assert_eq!(
        e.to_string(),
        "feature `token_to_rep_atom`, axis 1 (atoms): nonzero entries outside the diagonal blocks; each item must point at an item of its own shard"
    );
}

#[test]
fn a_domain_parallel_plan_is_refused() {
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/weather.yaml");
    let (_, plan) = featshard_spec::compile_file(&path).unwrap();
    let e = featshard_runtime::pad(
        &plan,
        common::mesh(&[3, 1]),
        &Default::default(),
        &Default::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&e, RuntimeError::Unsupported { message } if message.contains("`weather_placements` is a domain-parallel (ShardTensor) plan")),
        "{e}"
    );
}
