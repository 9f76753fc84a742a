//! Malformed specs: each error names the right feature or axis and the right line:col.

mod support;

use featshard_spec::compile_str;
use support::{assert_error, errors_of};

/// Lines 1-12 of every feature-level case; case features start on line 13.
const BASE: &str = "\
version: 1
module: demo
mesh:
  cp: [cp0, cp1]
  dp: dp
semantics:
  tokens: {shard: true}
  atoms: {shard: true, owner: tokens, counts: atom_counts}
  ensemble: {shard: false}
workflows: [training, inference]
features:
  atom_counts: {axes: [tokens], dtype: int64}
";

fn with_features(features: &str) -> String {
    format!("{BASE}{features}")
}

#[test]
fn the_base_spec_is_valid() {
    compile_str("spec.yaml", BASE).expect("base spec must be valid");
}

#[test]
fn yaml_syntax_error() {
    assert_error(
        &with_features("  x: {axes: [tokens, dtype: int64}\n"),
        &["spec.yaml:13:", "invalid YAML"],
    );
}

#[test]
fn tab_indentation_is_a_syntax_error() {
    assert_error(
        &with_features("  x:\n\taxes: [tokens]\n"),
        &["spec.yaml:14:", "invalid YAML"],
    );
}

#[test]
fn unknown_feature_key() {
    assert_error(
        &with_features("  x: {axes: [tokens], dtyp: int64}\n"),
        &["spec.yaml:13:23", "unknown field `dtyp`"],
    );
}

#[test]
fn unknown_top_level_key() {
    let text = BASE.replace("workflows:", "workflow:");
    assert_error(&text, &["spec.yaml:10:1", "unknown field `workflow`"]);
}

#[test]
fn undeclared_semantic_on_an_axis() {
    assert_error(
        &with_features("  x: {axes: [tokens, residues], dtype: int64}\n"),
        &[
            "spec.yaml:13:22",
            "feature `x`",
            "axis 1 (residues)",
            "semantic `residues` is not declared",
        ],
    );
}

#[test]
fn undeclared_semantic_suggests_the_closest() {
    assert_error(
        &with_features("  x: {axes: [token], dtype: int64}\n"),
        &[
            "spec.yaml:13:14",
            "feature `x`",
            "axis 0 (token)",
            "did you mean `tokens`?",
        ],
    );
}

#[test]
fn unknown_dtype() {
    assert_error(
        &with_features("  x: {axes: [tokens], dtype: float128}\n"),
        &["spec.yaml:13:30", "feature `x`", "unknown dtype `float128`"],
    );
}

#[test]
fn missing_dtype() {
    assert_error(
        &with_features("  x: {axes: [tokens]}\n"),
        &["spec.yaml:13:3", "feature `x`", "needs `dtype`"],
    );
}

#[test]
fn feature_without_body() {
    assert_error(
        &with_features("  x:\n"),
        &["spec.yaml:13:3", "feature `x`", "needs `axes` and `dtype`"],
    );
}

#[test]
fn empty_spec() {
    assert_error("", &["spec.yaml:1:1", "spec is empty"]);
    assert_error("# only a comment\n", &["spec.yaml:1:1", "spec is empty"]);
}

#[test]
fn spec_without_features() {
    let text = BASE.replace("  atom_counts: {axes: [tokens], dtype: int64}\n", "");
    assert_error(&text, &["declares no features"]);
}

#[test]
fn duplicate_feature_name() {
    assert_error(
        &with_features("  x: {axes: [tokens], dtype: int64}\n  x: {axes: [atoms], dtype: int64}\n"),
        &["spec.yaml:14:3", "duplicate", "x"],
    );
}

#[test]
fn duplicate_semantic_name() {
    let text = BASE.replace(
        "  ensemble: {shard: false}\n",
        "  ensemble: {shard: false}\n  tokens: {shard: false}\n",
    );
    assert_error(&text, &["spec.yaml:10:3", "duplicate", "tokens"]);
}

#[test]
fn duplicate_workflow_name() {
    let text = BASE.replace(
        "workflows: [training, inference]",
        "workflows: [training, training]",
    );
    assert_error(
        &text,
        &["spec.yaml:10:23", "workflow `training` is declared twice"],
    );
}

#[test]
fn alias_bomb_is_refused() {
    // Untagged values (here `pad`) buffer whatever YAML they are given, so an alias
    // bomb there would expand in memory without the parser's node budget.
    let mut bomb = String::from("[&a0 [x, x, x, x, x, x, x, x, x, x]");
    for i in 1..9 {
        let p = i - 1;
        bomb.push_str(&format!(
            ", &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]"
        ));
    }
    bomb.push(']');
    let text = with_features(&format!(
        "  x: {{axes: [tokens], dtype: int64, pad: {bomb}}}\n"
    ));
    // The outcome is asserted here; how fast the refusal is belongs to
    // `cargo bench --bench hostile_specs`.
    let rendered = errors_of(&text);
    assert!(
        rendered.contains("budget"),
        "expected the alias budget to be breached, got:\n{rendered}"
    );
    assert!(rendered.contains("spec.yaml:13:"), "{rendered}");
}

#[test]
fn deeply_nested_yaml_is_refused() {
    let text = format!(
        "version: 1\nmodule: demo\nx: {}{}\n",
        "[".repeat(200),
        "]".repeat(200)
    );
    assert_error(&text, &["spec.yaml:3:", "invalid YAML"]);
}

#[test]
fn cosharded_with_an_unsharded_leader() {
    assert_error(
        &with_features(
            "  x:\n    axes: [ensemble, tokens]\n    dtype: int64\n    coshard: [{axis: 1, follows: 0}]\n",
        ),
        &[
            "spec.yaml:16:15",
            "feature `x`",
            "axis 0 (ensemble)",
            "co-sharded with something that is not sharded",
        ],
    );
}

#[test]
fn cosharded_axes_without_ownership() {
    let text = BASE.replace(
        "  ensemble: {shard: false}\n",
        "  ensemble: {shard: false}\n  msa: {shard: true}\n",
    );
    let text = format!(
        "{text}  x:\n    axes: [msa, atoms]\n    dtype: int64\n    coshard: [{{axis: 1, follows: 0}}]\n"
    );
    assert_error(
        &text,
        &[
            "spec.yaml:17:15",
            "feature `x`",
            "axis 1 (atoms)",
            "cannot follow `msa`",
        ],
    );
}

#[test]
fn coshard_axis_out_of_range() {
    assert_error(
        &with_features(
            "  x:\n    axes: [atoms, tokens]\n    dtype: int64\n    coshard: [{axis: 2, follows: 0}]\n",
        ),
        &["spec.yaml:16:15", "feature `x`", "co-shard axis 2 is out of range"],
    );
}

#[test]
fn coshard_axis_follows_itself() {
    assert_error(
        &with_features(
            "  x:\n    axes: [atoms, tokens]\n    dtype: int64\n    coshard: [{axis: 0, follows: 0}]\n",
        ),
        &["spec.yaml:16:15", "feature `x`", "axis 0 (atoms)", "cannot follow itself"],
    );
}

#[test]
fn coshard_of_a_channel_axis() {
    assert_error(
        &with_features(
            "  x:\n    axes: [atoms, 3]\n    dtype: int64\n    coshard: [{axis: 1, follows: 0}]\n",
        ),
        &[
            "spec.yaml:16:15",
            "feature `x`",
            "axis 1 (3)",
            "not channel axes",
        ],
    );
}

#[test]
fn explicit_placement_contradicts_inference() {
    assert_error(
        &with_features(
            "  x:\n    axes: [ensemble, tokens]\n    dtype: float32\n    placement: [Shard(0), Replicate()]\n",
        ),
        &[
            "spec.yaml:16:16",
            "feature `x`",
            "axis 0 (ensemble)",
            "contradicts the inferred (Shard(1), Replicate())",
        ],
    );
}

#[test]
fn explicit_placement_of_wrong_length() {
    assert_error(
        &with_features("  x:\n    axes: [tokens]\n    dtype: float32\n    placement: [Shard(0)]\n"),
        &["spec.yaml:16:16", "feature `x`", "contradicts"],
    );
}

#[test]
fn explicit_placement_that_does_not_parse() {
    assert_error(
        &with_features(
            "  x:\n    axes: [tokens]\n    dtype: float32\n    placement: [Shard(x), Replicate()]\n",
        ),
        &["spec.yaml:16:17", "feature `x`", "`Shard(x)` is not a placement"],
    );
}

#[test]
fn more_sharded_axes_than_mesh_axes() {
    assert_error(
        &with_features("  x: {axes: [tokens, tokens, tokens], dtype: float32}\n"),
        &[
            "spec.yaml:13:30",
            "feature `x`",
            "axis 2 (tokens)",
            "more sharded axes than the 2 CP mesh axes",
            "replicate_axes: [2]",
        ],
    );
}

#[test]
fn replicate_axes_resolves_too_many_sharded_axes() {
    let text = with_features(
        "  x: {axes: [tokens, tokens, tokens], dtype: float32, replicate_axes: [2]}\n",
    );
    compile_str("spec.yaml", &text).expect("declared resolution must be accepted");
}

#[test]
fn replicate_axis_on_an_unsharded_axis() {
    assert_error(
        &with_features("  x: {axes: [ensemble, tokens], dtype: float32, replicate_axes: [0]}\n"),
        &[
            // The entry `0` itself, not the list's `[`.
            "spec.yaml:13:66",
            "feature `x`",
            "axis 0 (ensemble)",
            "never sharded",
        ],
    );
}

#[test]
fn mask_with_nonzero_pad() {
    assert_error(
        &with_features("  x: {axes: [tokens], dtype: float32, mask: tokens, pad: 1}\n"),
        &["spec.yaml:13:58", "feature `x`", "a mask is 0 at pads"],
    );
}

#[test]
fn mask_of_a_semantic_the_feature_lacks() {
    assert_error(
        &with_features("  x: {axes: [tokens], dtype: float32, mask: atoms}\n"),
        &[
            "spec.yaml:13:45",
            "feature `x`",
            "masks `atoms` but has no `atoms` axis",
        ],
    );
}

#[test]
fn index_of_an_undeclared_semantic() {
    assert_error(
        &with_features(
            "  x: {axes: [tokens], dtype: int64, index: {of: residues, scope: serial}}\n",
        ),
        &[
            "spec.yaml:13:44",
            "feature `x`",
            "semantic `residues` is not declared",
        ],
    );
}

#[test]
fn unknown_index_scope() {
    assert_error(
        &with_features("  x: {axes: [tokens], dtype: int64, index: {of: atoms, scope: global}}\n"),
        &[
            "spec.yaml:13:44",
            "feature `x`",
            "unknown index scope `global`",
        ],
    );
}

#[test]
fn index_values_need_an_integer_dtype() {
    assert_error(
        &with_features(
            "  x: {axes: [tokens], dtype: float32, index: {of: atoms, scope: padded_global}}\n",
        ),
        &["spec.yaml:13:30", "feature `x`", "integer dtype"],
    );
}

#[test]
fn shard_local_one_hot_needs_a_cosharded_axis() {
    assert_error(
        &with_features(
            "  x: {axes: [atoms, tokens], dtype: int64, index: {of: tokens, scope: shard_local, one_hot: 1}}\n",
        ),
        &["spec.yaml:13:51", "feature `x`", "axis 1 (tokens)", "co-sharded"],
    );
}

#[test]
fn shard_local_index_of_unsharded_feature() {
    assert_error(
        &with_features(
            "  x: {axes: [ensemble], dtype: int64, index: {of: tokens, scope: shard_local}}\n",
        ),
        &[
            "spec.yaml:13:46",
            "feature `x`",
            "need the feature itself to be sharded",
        ],
    );
}

#[test]
fn pad_value_that_does_not_fit_the_dtype() {
    assert_error(
        &with_features("  x: {axes: [tokens], dtype: int64, pad: 1.5}\n"),
        &[
            "spec.yaml:13:42",
            "feature `x`",
            "pad value 1.5 does not fit dtype int64",
        ],
    );
    assert_error(
        &with_features("  y: {axes: [tokens], dtype: uint8, pad: 300}\n"),
        &[
            "spec.yaml:13:42",
            "feature `y`",
            "pad value 300 does not fit dtype uint8",
        ],
    );
}

#[test]
fn channel_axis_of_size_zero() {
    assert_error(
        &with_features("  x: {axes: [tokens, 0], dtype: int64}\n"),
        &[
            "spec.yaml:13:22",
            "feature `x`",
            "axis 1 (channel)",
            "at least 1",
        ],
    );
}

#[test]
fn workflow_that_is_not_declared() {
    assert_error(
        &with_features("  x: {axes: [tokens], dtype: int64, only: [trainig]}\n"),
        &[
            "spec.yaml:13:44",
            "feature `x`",
            "workflow `trainig` is not declared",
            "did you mean `training`?",
        ],
    );
}

#[test]
fn owner_counts_feature_missing() {
    let text = BASE.replace("counts: atom_counts", "counts: atoms_per_token");
    assert_error(
        &text,
        &[
            "spec.yaml:8:47",
            "semantic `atoms`",
            "owner counts `atoms_per_token` is not declared",
        ],
    );
}

#[test]
fn owner_counts_of_the_wrong_shape_and_dtype() {
    let text = BASE.replace(
        "  atom_counts: {axes: [tokens], dtype: int64}\n",
        "  atom_counts: {axes: [atoms], dtype: float32}\n",
    );
    assert_error(
        &text,
        &[
            "spec.yaml:12:23",
            "feature `atom_counts`",
            "must have axes `[tokens]`",
        ],
    );
    assert_error(
        &text,
        &["spec.yaml:12:39", "feature `atom_counts`", "integer dtype"],
    );
}

#[test]
fn owner_that_is_not_declared() {
    let text = BASE.replace("owner: tokens", "owner: residues");
    assert_error(
        &text,
        &[
            "spec.yaml:8:31",
            "semantic `atoms`",
            "`residues` is not declared",
        ],
    );
}

#[test]
fn sharded_items_of_an_unsharded_owner() {
    let text = BASE.replace("  tokens: {shard: true}", "  tokens: {shard: false}");
    assert_error(
        &text,
        &[
            "spec.yaml:8:31",
            "semantic `atoms`",
            "its owner `tokens` is not",
        ],
    );
}

#[test]
fn ownership_cycle() {
    let text = BASE.replace(
        "  tokens: {shard: true}",
        "  tokens: {shard: true, owner: atoms, counts: atom_counts}",
    );
    assert_error(&text, &["semantic `atoms`", "ownership cycle"]);
}

#[test]
fn owner_without_counts_or_map() {
    let text = BASE.replace(", counts: atom_counts", "");
    assert_error(
        &text,
        &[
            "spec.yaml:8:31",
            "semantic `atoms`",
            "needs `counts: <feature>` or `map: <feature>`",
        ],
    );
}

#[test]
fn semantic_without_shard_flag() {
    let text = BASE.replace("  ensemble: {shard: false}", "  ensemble: {}");
    assert_error(&text, &["spec.yaml:9:13", "missing field `shard`"]);
}

#[test]
fn cp_mesh_has_one_or_two_axes() {
    let text = BASE.replace("cp: [cp0, cp1]", "cp: [cp0, cp1, cp2]");
    assert_error(
        &text,
        &[
            "spec.yaml:4:7",
            "a CP mesh has one axis `[cp]` or two `[cp0, cp1]`, 3 given",
        ],
    );
    let text = BASE.replace("cp: [cp0, cp1]", "cp: []");
    assert_error(&text, &["spec.yaml:4:7", "0 given"]);
}

#[test]
fn mesh_axis_names_must_differ() {
    let text = BASE.replace("  dp: dp", "  dp: cp0");
    assert_error(
        &text,
        &["spec.yaml:5:7", "mesh axis name `cp0` is used twice"],
    );
}

#[test]
fn feature_names_must_be_snake_case() {
    assert_error(
        &with_features("  Bad-Name: {axes: [tokens], dtype: int64}\n"),
        &["spec.yaml:13:3", "feature `Bad-Name`", "snake_case"],
    );
}

/// A feature of a nested dict is named by its path (`constraint_feature.contact`); a
/// flattened name with `__` is told the rule, and a path through a feature refused.
#[test]
fn feature_paths_name_features_of_nested_dicts() {
    let ok = with_features("  constraint.contact: {axes: [tokens, tokens, 2], dtype: float32}\n");
    let (_, plan) = compile_str("spec.yaml", &ok).expect("a path names a feature");
    assert!(plan.tensor("constraint.contact").is_some());
    assert_error(
        &with_features("  constraint__contact: {axes: [tokens], dtype: int64}\n"),
        &[
            "spec.yaml:13:3",
            "feature `constraint__contact`",
            "no `__`",
            "joined by `.`",
        ],
    );
    assert_error(
        &with_features(
            "  c: {axes: [tokens], dtype: int64}\n  c.d: {axes: [tokens], dtype: int64}\n",
        ),
        &["spec.yaml:14:3", "feature `c.d`", "`c` is a feature"],
    );
    assert_error(
        &format!("{}separator: _\n", with_features("")),
        &["spec.yaml:13:12", "could not be told from a name"],
    );
    let slash = format!("{}separator: /\n", with_features(""));
    let (_, plan) = compile_str("spec.yaml", &slash).expect("`/` separates");
    assert_eq!(plan.inputs.key_of("a.b"), "a/b");
    assert_eq!(plan.inputs.name_of_key("a/b"), "a.b");
}

/// `layout: windows` (owned items in serial order, each rank's block whole windows)
/// needs a window, and a 2-D tile then has no diagonal block of the items to co-shard.
#[test]
fn a_windows_layout_needs_a_window_and_no_co_sharded_map() {
    let owned = "atoms: {shard: true, owner: tokens, counts: atom_counts}";
    assert!(BASE.contains(owned));
    let with = |keys: &str| {
        BASE.replace(
            owned,
            &format!("atoms: {{shard: true, owner: tokens, counts: atom_counts{keys}}}"),
        )
    };
    assert_error(
        &with(", layout: windows"),
        &["spec.yaml:8:", "`layout: windows` needs the window"],
    );
    assert_error(
        &with(", layout: packed"),
        &["spec.yaml:8:", "unknown `layout` value `packed`"],
    );
    let windowed = with(", window: 32, layout: windows");
    compile_str("spec.yaml", &windowed).expect("a windowed layout with its window");
    let map = "  m: {axes: [atoms, tokens], dtype: int64, coshard: [{axis: 1, follows: 0}], index: {of: tokens, scope: shard_local, one_hot: 1}}\n";
    assert_error(
        &format!("{windowed}{map}"),
        &["feature `m`", "serial order", "id vector"],
    );
    // On one CP axis the map's token axis stays whole, as it always does there.
    let one_axis = windowed.replace("cp: [cp0, cp1]", "cp: [cp]");
    compile_str("spec.yaml", &format!("{one_axis}{map}")).expect("a whole map on one axis");
}

#[test]
fn module_name_must_be_an_identifier() {
    let text = BASE.replace("module: demo", "module: class");
    assert_error(&text, &["spec.yaml:2:9", "module name `class`"]);
}

#[test]
fn unsupported_version() {
    let text = BASE.replace("version: 1", "version: 7");
    assert_error(&text, &["spec.yaml:1:10", "unsupported spec version 7"]);
}

#[test]
fn metadata_with_tensor_keys() {
    assert_error(
        &with_features("  record: {metadata: true, dtype: int64}\n"),
        &[
            "spec.yaml:13:35",
            "feature `record`",
            "`dtype` does not apply",
        ],
    );
}

#[test]
fn one_hot_serial_index_is_refused() {
    assert_error(
        &with_features(
            "  x:\n    axes: [atoms, tokens]\n    dtype: int64\n    coshard: [{axis: 1, follows: 0}]\n    index: {of: tokens, scope: serial, one_hot: 1}\n",
        ),
        &["spec.yaml:17:12", "feature `x`", "axis 1 (tokens)", "cannot stay serial"],
    );
}

#[test]
fn every_error_is_reported_not_just_the_first() {
    let rendered = errors_of(&with_features(
        "  x: {axes: [residues], dtype: int64}\n  y: {axes: [tokens], dtype: int64, pad: 1.5}\n",
    ));
    assert!(rendered.contains("feature `x`"), "{rendered}");
    assert!(rendered.contains("feature `y`"), "{rendered}");
}

#[test]
fn a_feature_with_too_many_axes() {
    let axes = vec!["3"; featshard_spec::limits::MAX_AXES + 1].join(", ");
    assert_error(
        &with_features(&format!("  x: {{axes: [{axes}], dtype: float32}}\n")),
        &[
            "spec.yaml:13:",
            "feature `x`",
            "axes, more than the limit of 32",
        ],
    );
}

#[test]
fn a_spec_over_the_size_limit() {
    let mut text = with_features("");
    text.push('#');
    text.push_str(&"x".repeat(featshard_spec::limits::MAX_SPEC_BYTES));
    assert_error(&text, &["more than the limit of 33554432 bytes"]);
}

#[test]
fn too_many_features() {
    let mut text = with_features("");
    for i in 0..=featshard_spec::limits::MAX_FEATURES {
        text.push_str(&format!("  f{i}: {{axes: [tokens], dtype: int64}}\n"));
    }
    assert_error(&text, &["features declared, more than the limit of 10000"]);
}

#[test]
fn one_hot_axis_out_of_range() {
    assert_error(
        &with_features("  x: {axes: [tokens, 3], dtype: int64, one_hot: 2}\n"),
        &[
            "spec.yaml:13:49",
            "feature `x`",
            "one-hot axis 2 is out of range (2 axes)",
        ],
    );
}

#[test]
fn one_hot_axis_of_a_semantic() {
    assert_error(
        &with_features("  x: {axes: [tokens, 3], dtype: int64, one_hot: 0}\n"),
        &[
            "spec.yaml:13:49",
            "feature `x`",
            "axis 0 (tokens)",
            "must be a channel axis",
        ],
    );
}

#[test]
fn one_hot_mask() {
    assert_error(
        &with_features("  x: {axes: [tokens, 3], dtype: float32, mask: tokens, one_hot: 1}\n"),
        &[
            "spec.yaml:13:65",
            "feature `x`",
            "axis 1 (3)",
            "a one-hot feature is plain data",
        ],
    );
}

#[test]
fn one_hot_with_a_nonzero_pad() {
    assert_error(
        &with_features("  x: {axes: [tokens, 3], dtype: int64, pad: 1, one_hot: 1}\n"),
        &[
            "spec.yaml:13:57",
            "feature `x`",
            "axis 1 (3)",
            "pads with zero rows (no class); pad 1 would be a class",
        ],
    );
}

#[test]
fn sparse_is_plain_data_padded_with_zeros() {
    assert_error(
        &with_features(
            "  x: {axes: [tokens, tokens], dtype: float32, mask: tokens, sparse: true}\n",
        ),
        &[
            "spec.yaml:13:69",
            "feature `x`",
            "a sparse feature is plain data",
        ],
    );
    assert_error(
        &with_features("  x: {axes: [tokens, tokens], dtype: float32, pad: 1.5, sparse: true}\n"),
        &[
            "spec.yaml:13:65",
            "feature `x`",
            "pads with zeros (no entry); pad 1.5 would be an entry",
        ],
    );
    assert_error(
        &with_features("  x: {axes: [tokens, 3], dtype: int64, one_hot: 1, sparse: true}\n"),
        &["feature `x`", "one-hot or sparse, not both"],
    );
}

#[test]
fn a_range_is_two_ordered_integers_that_hold_the_pad_and_fit_the_dtype() {
    let cases = [
        ("range: [5, 2]", "`range: [5, 2]` is empty"),
        ("range: [0]", "`range` is two integers, `[lo, hi]`"),
        ("range: [0, 1.5]", "`range` is two integers, `[lo, hi]`"),
        (
            "range: [0, 300], dtype: uint8",
            "`range: [0, 300]` does not fit dtype uint8",
        ),
        (
            "range: [0, 3], dtype: float32",
            "`range` narrows integer features; this one is float32",
        ),
        ("range: [1, 3]", "pad 0 lies outside `range: [1, 3]`"),
        ("range: [0, 3], mask: tokens", "`range` is for plain data"),
    ];
    for (keys, message) in cases {
        let dtype = if keys.contains("dtype") {
            ""
        } else {
            ", dtype: int64"
        };
        let line = format!("  x: {{axes: [tokens]{dtype}, {keys}}}\n");
        assert_error(
            &with_features(&line),
            &["spec.yaml:13:", "feature `x`", message],
        );
    }
}

/// An index's none value names no item: a non-negative one would name one, a one-hot
/// map has none (a row of zeros), and it fits the dtype; each error at the index.
#[test]
fn an_index_none_value_that_could_name_an_item_is_refused() {
    assert_error(
        &with_features(
            "  f: {axes: [tokens], dtype: int64, index: {of: atoms, scope: padded_global, none: 0}}\n",
        ),
        &["spec.yaml:13:", "feature `f`", "`none: 0` would name item 0 of `atoms`"],
    );
    assert_error(
        &with_features(
            "  m: {axes: [atoms, tokens], dtype: int64, index: {of: tokens, scope: shard_local, one_hot: 1, none: -1}, coshard: [{axis: 1, follows: 0}]}\n",
        ),
        &["spec.yaml:13:", "feature `m`", "a one-hot map has no none value"],
    );
    assert_error(
        &with_features(
            "  f: {axes: [tokens], dtype: int8, index: {of: tokens, scope: padded_global, none: -300}}\n",
        ),
        &["spec.yaml:13:", "feature `f`", "`none: -300` does not fit int8"],
    );
    let ok = with_features(
        "  f: {axes: [tokens], dtype: int64, pad: -1, index: {of: atoms, scope: padded_global, none: -1}}\n",
    );
    compile_str("spec.yaml", &ok).expect("a none of -1 is a valid declaration");
}

/// A validity mask made from the lengths (`derive: {valid: true}`) is a mask with only
/// axes of the semantics it masks; `derive` takes one rule.
#[test]
fn a_derived_validity_mask_must_be_a_mask_of_its_axes() {
    assert_error(
        &with_features("  v: {axes: [tokens], dtype: bool, derive: {valid: true}}\n"),
        &[
            "spec.yaml:13:",
            "feature `v`",
            "a derived validity mask is a mask",
        ],
    );
    assert_error(
        &with_features(
            "  v: {axes: [tokens, 3], dtype: bool, mask: tokens, derive: {valid: true}}\n",
        ),
        &[
            "spec.yaml:13:",
            "feature `v`",
            "axis 1",
            "not a semantic it masks",
        ],
    );
    assert_error(
        &with_features(
            "  v: {axes: [tokens, tokens], dtype: bool, mask: tokens, derive: {valid: true, outer: [atom_counts]}}\n",
        ),
        &["spec.yaml:13:", "feature `v`", "one rule"],
    );
    let ok = with_features(
        "  v: {axes: [tokens, atoms], dtype: float32, mask: [tokens, atoms], derive: {valid: true}}\n",
    );
    compile_str("spec.yaml", &ok).expect("a validity mask over its semantics is valid");
}

/// `map_pad` names the value an owner id vector holds at incoming pads: it needs an id
/// vector (a one-hot map's pad rows are zeros), and an id that vector may hold.
#[test]
fn a_map_pad_needs_an_id_vector_and_an_id_it_may_hold() {
    let ids = BASE
        .replace(
            "  atoms: {shard: true, owner: tokens, counts: atom_counts}",
            "  atoms: {shard: true, owner: tokens, map: a2t, incoming_pads: {mask: atom_mask, map_pad: -1}}",
        )
        + "  a2t: {axes: [atoms], dtype: int32, index: {of: tokens, scope: shard_local}}\n  atom_mask: {axes: [atoms], dtype: float32, mask: atoms}\n";
    assert_error(
        &ids,
        &[
            "spec.yaml:8:",
            "feature `a2t`, semantic `atoms`",
            "`map_pad: -1` must be an id `a2t` can hold",
        ],
    );
    compile_str("spec.yaml", &ids.replace("map_pad: -1", "map_pad: 0")).expect("map_pad: 0");
    let none = ids.replace("scope: shard_local}", "scope: shard_local, none: -1}");
    compile_str("spec.yaml", &none).expect("map_pad: its none");
    let counts = BASE.replace(
        "counts: atom_counts}",
        "counts: atom_counts, incoming_pads: {counts: true, map_pad: 0}}",
    );
    assert_error(
        &counts,
        &[
            "spec.yaml:8:",
            "semantic `atoms`",
            "`map_pad` is the value an owner id vector holds",
        ],
    );
}
