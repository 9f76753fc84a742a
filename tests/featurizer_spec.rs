//! The spec vocabulary for real featurizer output (incoming pads, owner counts or maps,
//! unowned rows, optional, derived and dropped keys): what it accepts, and each error
//! naming the feature or semantic and the YAML line and column.

mod support;

use featshard_spec::compile_str;
use featshard_spec::ir::{DeriveRule, IncomingSource, KeyPolicy, OwnerSource};
use featshard_spec::plan::{FeaturePlan, Padding};
use support::assert_error;

/// Lines 1-17 of every case; case lines start at line 18 (features) unless replaced.
const BASE: &str = "\
version: 1
module: demo
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true, incoming_pads: {mask: token_mask}}
  atoms: {shard: true, owner: tokens, counts: counts, map: atom_to_token, incoming_pads: {mask: atom_mask}}
  rset: {shard: true, owner: atoms, map: rset_to_atom, unowned_rows: pad}
  lists: {shard: false}
drop: [unused]
other_keys: refuse
features:
  token_mask: {axes: [tokens], dtype: float32, mask: tokens}
  atom_mask: {axes: [atoms], dtype: float32, mask: atoms}
  counts: {axes: [tokens], dtype: int64, optional: true}
  atom_to_token: {axes: [atoms, tokens], dtype: int64, coshard: [{axis: 1, follows: 0}], index: {of: tokens, scope: shard_local, one_hot: 1}}
  rset_to_atom: {axes: [rset, atoms], dtype: int64, coshard: [{axis: 1, follows: 0}], index: {of: atoms, scope: shard_local, one_hot: 1}}
  pair_mask: {axes: [tokens, tokens], dtype: float32, mask: tokens, derive: {outer: [token_mask]}}
";

fn with(extra: &str) -> String {
    format!("{BASE}{extra}")
}

#[test]
fn the_base_spec_plans_every_new_rule() {
    let (_, plan) =
        compile_str("spec.yaml", BASE).unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let tokens = &plan.semantics["tokens"];
    assert_eq!(
        tokens.incoming,
        Some(IncomingSource::Mask {
            feature: "token_mask".into()
        })
    );
    let Padding::OwnerBlocks { source, .. } = &plan.semantics["atoms"].padding else {
        panic!("atoms are owner-partitioned");
    };
    assert_eq!(
        source,
        &OwnerSource::CountsOrMap {
            counts: "counts".into(),
            map: "atom_to_token".into()
        }
    );
    assert!(plan.semantics["rset"].unowned_rows_are_pads);
    assert_eq!(plan.inputs.drop, ["unused"]);
    assert_eq!(plan.inputs.other_keys, KeyPolicy::Refuse);
    let FeaturePlan::Tensor(pair) = &plan.features["pair_mask"] else {
        panic!("a tensor");
    };
    assert_eq!(
        pair.derived,
        Some(DeriveRule::Outer {
            of: ["token_mask".into(), "token_mask".into()]
        })
    );
    let FeaturePlan::Tensor(counts) = &plan.features["counts"] else {
        panic!("a tensor");
    };
    assert!(counts.optional);
}

#[test]
fn incoming_pads_need_a_mask_or_counts() {
    let text = BASE.replace("incoming_pads: {mask: token_mask}", "incoming_pads: {}");
    assert_error(
        &text,
        &[
            "spec.yaml:5:40",
            "semantic `tokens`",
            "needs `mask: <feature>` or `counts: true`",
        ],
    );
}

#[test]
fn incoming_pads_mask_and_counts_together() {
    let text = BASE.replace(
        "incoming_pads: {mask: atom_mask}",
        "incoming_pads: {mask: atom_mask, counts: true}",
    );
    assert_error(&text, &["spec.yaml:6:", "semantic `atoms`", "not both"]);
}

#[test]
fn incoming_pads_from_counts_need_counts() {
    let text = BASE.replace(
        "incoming_pads: {mask: token_mask}",
        "incoming_pads: {counts: true}",
    );
    assert_error(
        &text,
        &[
            "spec.yaml:5:",
            "semantic `tokens`",
            "needs `owner` and `counts: <feature>`",
        ],
    );
}

#[test]
fn incoming_pads_from_counts_that_may_be_absent() {
    let text = BASE.replace(
        "incoming_pads: {mask: atom_mask}",
        "incoming_pads: {counts: true}",
    );
    assert_error(
        &text,
        &["spec.yaml:14:", "feature `counts`", "cannot be optional"],
    );
}

#[test]
fn an_undeclared_incoming_mask() {
    let text = BASE.replace("{mask: token_mask}", "{mask: token_msk}");
    assert_error(
        &text,
        &[
            "spec.yaml:5:",
            "semantic `tokens`",
            "incoming-pad mask `token_msk` is not declared",
            "did you mean `token_mask`?",
        ],
    );
}

#[test]
fn an_incoming_mask_must_be_a_1d_mask_of_its_semantic() {
    let text = BASE.replace(
        "  token_mask: {axes: [tokens], dtype: float32, mask: tokens}",
        "  token_mask: {axes: [tokens, 2], dtype: float32}",
    );
    assert_error(
        &text,
        &[
            "spec.yaml:12:",
            "feature `token_mask`",
            "must be a mask with axes `[tokens]`",
        ],
    );
}

#[test]
fn an_optional_incoming_mask() {
    let text = BASE.replace(
        "  atom_mask: {axes: [atoms], dtype: float32, mask: atoms}",
        "  atom_mask: {axes: [atoms], dtype: float32, mask: atoms, optional: true}",
    );
    assert_error(
        &text,
        &["spec.yaml:13:", "feature `atom_mask`", "cannot be optional"],
    );
}

#[test]
fn an_optional_owner_map() {
    let text = BASE.replace(
        "  rset_to_atom: {axes: [rset, atoms], dtype: int64,",
        "  rset_to_atom: {axes: [rset, atoms], dtype: int64, optional: true,",
    );
    assert_error(
        &text,
        &[
            "spec.yaml:16:",
            "feature `rset_to_atom`",
            "owner map",
            "cannot be optional",
        ],
    );
}

#[test]
fn unowned_rows_need_a_map() {
    let text = BASE.replace(
        "  rset: {shard: true, owner: atoms, map: rset_to_atom, unowned_rows: pad}",
        "  rset: {shard: true, unowned_rows: pad}",
    );
    assert_error(
        &text,
        &[
            "spec.yaml:7:",
            "semantic `rset`",
            "applies to items owned through `map",
        ],
    );
}

#[test]
fn an_unknown_unowned_rows_value() {
    let text = BASE.replace("unowned_rows: pad", "unowned_rows: skip");
    assert_error(
        &text,
        &[
            "spec.yaml:7:",
            "semantic `rset`",
            "unknown `unowned_rows` value `skip`",
        ],
    );
}

#[test]
fn derived_from_an_undeclared_feature() {
    let text = BASE.replace(
        "derive: {outer: [token_mask]}",
        "derive: {outer: [token_mask, nope]}",
    );
    assert_error(
        &text,
        &[
            "spec.yaml:17:",
            "feature `pair_mask`",
            "derives from `nope`, which is not declared",
        ],
    );
}

#[test]
fn derived_axes_must_be_the_inputs_axes() {
    let text = BASE.replace(
        "pair_mask: {axes: [tokens, tokens]",
        "pair_mask: {axes: [tokens, atoms]",
    );
    assert_error(
        &text,
        &[
            "spec.yaml:17:",
            "feature `pair_mask`",
            "has axes [tokens, tokens], but this feature has [tokens, atoms]",
        ],
    );
}

#[test]
fn derived_from_an_optional_feature() {
    assert_error(
        &with("  c2: {axes: [tokens, tokens], dtype: int64, derive: {outer: [counts]}}\n"),
        &[
            "spec.yaml:18:",
            "feature `c2`",
            "derives from `counts`, which a sample may lack",
        ],
    );
}

#[test]
fn a_derived_feature_cannot_be_optional() {
    let text = BASE.replace(
        "derive: {outer: [token_mask]}",
        "derive: {outer: [token_mask]}, optional: true",
    );
    assert_error(
        &text,
        &["spec.yaml:17:", "feature `pair_mask`", "cannot be optional"],
    );
}

#[test]
fn outer_takes_one_or_two_features() {
    let text = BASE.replace(
        "{outer: [token_mask]}",
        "{outer: [token_mask, token_mask, token_mask]}",
    );
    assert_error(
        &text,
        &[
            "spec.yaml:17:",
            "feature `pair_mask`",
            "one or two features, 3 given",
        ],
    );
}

#[test]
fn metadata_cannot_be_derived() {
    assert_error(
        &with("  m: {metadata: true, derive: {outer: [token_mask]}}\n"),
        &["spec.yaml:18:", "feature `m`", "`derive` does not apply"],
    );
}

#[test]
fn a_dropped_key_cannot_be_a_feature() {
    let text = BASE.replace("drop: [unused]", "drop: [unused, counts]");
    assert_error(
        &text,
        &["spec.yaml:9:16", "feature `counts`", "cannot be dropped"],
    );
}

#[test]
fn a_key_dropped_twice() {
    let text = BASE.replace("drop: [unused]", "drop: [unused, unused]");
    assert_error(
        &text,
        &["spec.yaml:9:16", "`unused` is listed twice in `drop`"],
    );
}

#[test]
fn an_unknown_other_keys_policy() {
    let text = BASE.replace("other_keys: refuse", "other_keys: keep");
    assert_error(
        &text,
        &[
            "spec.yaml:10:13",
            "unknown `other_keys` policy `keep`",
            "`refuse`, `drop`, `pass`",
        ],
    );
}
