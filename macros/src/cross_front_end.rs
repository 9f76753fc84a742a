//! Every malformed spec the derive can express, written both ways: the YAML front end
//! and the derive must give the same errors, each at the same value (the YAML's
//! underlined text is the attribute token the derive's error spans).

use featshard_spec::diag::SpecError;

/// A malformed spec as YAML (semantics and features under the common header) and as
/// derive attributes on `struct M` (`semantic(tokens, shard)` and `module = "m"` given).
struct Case {
    name: &'static str,
    yaml_semantics: &'static str,
    yaml_features: &'static str,
    yaml_extra: &'static str,
    derive_struct: &'static str,
    derive_fields: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "a window of 0",
        yaml_semantics: "  msa: {shard: false, window: 0}",
        yaml_features: "  f: {axes: [tokens, msa], dtype: float32}",
        yaml_extra: "",
        derive_struct: "semantic(msa, window = 0)",
        derive_fields: "#[featshard(axes(tokens, msa), dtype = float32)] f: Tensor,",
    },
    Case {
        name: "a workflow declared twice",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: float32}",
        yaml_extra: "workflows: [training, training]",
        derive_struct: "workflows(training, training)",
        derive_fields: "#[featshard(axes(tokens), dtype = float32)] f: Tensor,",
    },
    Case {
        name: "an owner without counts or map",
        yaml_semantics: "  atoms: {shard: true, owner: tokens}",
        yaml_features: "  f: {axes: [atoms], dtype: float32}",
        yaml_extra: "",
        derive_struct: "semantic(atoms, shard, owner = tokens)",
        derive_fields: "#[featshard(axes(atoms), dtype = float32)] f: Tensor,",
    },
    Case {
        name: "counts without an owner",
        yaml_semantics: "  atoms: {shard: true, counts: n}",
        yaml_features: "  n: {axes: [tokens], dtype: int64}",
        yaml_extra: "",
        derive_struct: "semantic(atoms, shard, counts = n)",
        derive_fields: "#[featshard(axes(tokens), dtype = int64)] n: Tensor,",
    },
    Case {
        name: "incoming pads by counts without owner counts",
        yaml_semantics: "  atoms: {shard: true, incoming_pads: {counts: true}}",
        yaml_features: "  f: {axes: [atoms], dtype: float32}",
        yaml_extra: "",
        derive_struct: "semantic(atoms, shard, incoming_pads(counts))",
        derive_fields: "#[featshard(axes(atoms), dtype = float32)] f: Tensor,",
    },
    Case {
        name: "an unknown unowned_rows value",
        yaml_semantics: "  atoms: {shard: true, owner: tokens, map: m, unowned_rows: skip}",
        yaml_features: "  m: {axes: [atoms, tokens], dtype: bool}",
        yaml_extra: "",
        derive_struct: "semantic(atoms, shard, owner = tokens, map = m, unowned_rows = skip)",
        derive_fields: "#[featshard(axes(atoms, tokens), dtype = bool)] m: Tensor,",
    },
    Case {
        name: "an owner counts feature that is not declared",
        yaml_semantics: "  atoms: {shard: true, owner: tokens, counts: per_token}",
        yaml_features: "  f: {axes: [atoms], dtype: float32}",
        yaml_extra: "",
        derive_struct: "semantic(atoms, shard, owner = tokens, counts = per_token)",
        derive_fields: "#[featshard(axes(atoms), dtype = float32)] f: Tensor,",
    },
    Case {
        name: "an unknown other_keys policy",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: float32}",
        yaml_extra: "other_keys: keep",
        derive_struct: "other_keys = keep",
        derive_fields: "#[featshard(axes(tokens), dtype = float32)] f: Tensor,",
    },
    Case {
        name: "three CP mesh axes",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: float32}",
        yaml_extra: "",
        derive_struct: "mesh(cp0, cp1, cp2)",
        derive_fields: "#[featshard(axes(tokens), dtype = float32)] f: Tensor,",
    },
    Case {
        name: "an unknown dtype",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: float128}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = float128)] f: Tensor,",
    },
    Case {
        name: "an axis of an undeclared semantic",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens, residues], dtype: float32}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens, residues), dtype = float32)] f: Tensor,",
    },
    Case {
        name: "a mask and an index at once",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: int64, mask: tokens, index: {of: tokens, scope: serial}}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = int64, mask(tokens), index(of = tokens, scope = serial))] f: Tensor,",
    },
    Case {
        name: "an unknown index scope",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: int64, index: {of: tokens, scope: global}}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = int64, index(of = tokens, scope = global))] f: Tensor,",
    },
    Case {
        name: "a placement that does not parse",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: float32, placement: [\"Shard(0)\", \"Split(1)\"]}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = float32, placement(\"Shard(0)\", \"Split(1)\"))] f: Tensor,",
    },
    Case {
        name: "a placement that contradicts the inferred one",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: float32, placement: [Replicate(), Replicate()]}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = float32, placement(\"Replicate()\", \"Replicate()\"))] f: Tensor,",
    },
    Case {
        name: "an outer product of three features",
        yaml_semantics: "",
        yaml_features: "  m: {axes: [tokens], dtype: float32}\n  p: {axes: [tokens, tokens], dtype: float32, derive: {outer: [m, m, m]}}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = float32)] m: Tensor, #[featshard(axes(tokens, tokens), dtype = float32, derive(outer(m, m, m)))] p: Option<Tensor>,",
    },
    Case {
        name: "a derived validity mask that is no mask",
        yaml_semantics: "",
        yaml_features: "  v: {axes: [tokens], dtype: bool, derive: {valid: true}}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = bool, derive(valid))] v: Option<Tensor>,",
    },
    Case {
        name: "an id-vector owner map of floats",
        yaml_semantics: "  atoms: {shard: true, owner: tokens, map: m}",
        yaml_features: "  m: {axes: [atoms], dtype: float32, index: {of: tokens, scope: serial}}",
        yaml_extra: "",
        derive_struct: "semantic(atoms, shard, owner = tokens, map = m)",
        derive_fields: "#[featshard(axes(atoms), dtype = float32, index(of = tokens, scope = serial))] m: Tensor,",
    },
    Case {
        name: "an id-vector owner map of another semantic",
        yaml_semantics: "  atoms: {shard: true, owner: tokens, map: m}",
        yaml_features: "  m: {axes: [atoms], dtype: int32, index: {of: atoms, scope: serial}}",
        yaml_extra: "",
        derive_struct: "semantic(atoms, shard, owner = tokens, map = m)",
        derive_fields: "#[featshard(axes(atoms), dtype = int32, index(of = atoms, scope = serial))] m: Tensor,",
    },
    Case {
        name: "co-sharded with an unsharded axis",
        yaml_semantics: "  ensemble: {shard: false}",
        yaml_features: "  f: {axes: [ensemble, tokens], dtype: int64, coshard: [{axis: 1, follows: 0}]}",
        yaml_extra: "",
        derive_struct: "semantic(ensemble)",
        derive_fields: "#[featshard(axes(ensemble, tokens), dtype = int64, coshard(axis = 1, follows = 0))] f: Tensor,",
    },
    Case {
        name: "more sharded axes than mesh axes",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens, tokens, tokens], dtype: float32}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens, tokens, tokens), dtype = float32)] f: Tensor,",
    },
    Case {
        name: "a mask over an undeclared semantic",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: bool, mask: [residues]}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = bool, mask(residues))] f: Tensor,",
    },
    Case {
        name: "a one-hot axis of a semantic",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens, 5], dtype: int64, one_hot: 0}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens, 5), dtype = int64, one_hot = 0)] f: Tensor,",
    },
    Case {
        name: "a one-hot axis out of range",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens, 5], dtype: int64, one_hot: 4}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens, 5), dtype = int64, one_hot = 4)] f: Tensor,",
    },
    Case {
        name: "an index none value that names an item",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: int64, index: {of: tokens, scope: serial, none: 3}}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = int64, index(of = tokens, scope = serial, none = 3))] f: Tensor,",
    },
    Case {
        name: "an unknown delivery form",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: int64, index: {of: tokens, scope: shard_local, deliver: dense}}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = int64, index(of = tokens, scope = shard_local, deliver = dense))] f: Tensor,",
    },
    Case {
        name: "an id vector delivered as a one-hot with global columns",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: int64, index: {of: tokens, scope: serial, deliver: one_hot}}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = int64, index(of = tokens, scope = serial, deliver = one_hot))] f: Tensor,",
    },
    Case {
        name: "a halo of a feature over items not in serial order",
        yaml_semantics: "",
        yaml_features: "  x: {axes: [tokens, 3], dtype: float32}\n  f: {axes: [tokens, 3], dtype: float32, derive: {halo: {of: x, size: 4}}}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens, 3), dtype = float32)] x: Tensor, #[featshard(axes(tokens, 3), dtype = float32, derive(halo(of = x, size = 4)))] f: Tensor,",
    },
    Case {
        name: "a sparse mask",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: bool, mask: tokens, sparse: true}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = bool, mask(tokens), sparse)] f: Tensor,",
    },
    Case {
        name: "an empty range",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: int64, range: [5, 2]}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = int64, range(5, 2))] f: Tensor,",
    },
    Case {
        name: "a range on floats",
        yaml_semantics: "",
        yaml_features: "  f: {axes: [tokens], dtype: float32, range: [0, 3]}",
        yaml_extra: "",
        derive_struct: "",
        derive_fields: "#[featshard(axes(tokens), dtype = float32, range(0, 3))] f: Tensor,",
    },
];

fn yaml(c: &Case) -> String {
    let mut text = String::from(
        "version: 1\nmodule: m\nmesh: {cp: [cp0, cp1]}\nsemantics:\n  tokens: {shard: true}\n",
    );
    if c.name == "three CP mesh axes" {
        text = text.replace("[cp0, cp1]", "[cp0, cp1, cp2]");
    }
    for part in [c.yaml_semantics, "features:", c.yaml_features, c.yaml_extra] {
        if !part.is_empty() {
            text.push_str(part);
            text.push('\n');
        }
    }
    text
}

fn derive(c: &Case) -> syn::DeriveInput {
    let extra = if c.derive_struct.is_empty() {
        String::new()
    } else {
        format!(", {}", c.derive_struct)
    };
    let src = format!(
        "#[derive(Features)] #[featshard(module = \"m\", semantic(tokens, shard){extra})] struct M {{ {} }}",
        c.derive_fields
    );
    syn::parse_str(&src).unwrap_or_else(|e| panic!("{}: the derive input: {e}", c.name))
}

fn message(e: &SpecError) -> String {
    match &e.help {
        Some(h) => format!("{e}\nhelp: {h}"),
        None => e.to_string(),
    }
}

/// (message, the value it is at) for each error, sorted.
fn yaml_errors(c: &Case) -> Vec<(String, String)> {
    let text = yaml(c);
    let errors = match featshard_spec::compile_str("case.yaml", &text) {
        Ok(_) => panic!("{}: the YAML front end accepts\n{text}", c.name),
        Err(d) => d.errors,
    };
    let mut out: Vec<_> = errors
        .iter()
        .map(|e| (message(e), yaml_value(&text, e.loc.offset, e.loc.len)))
        .collect();
    out.sort();
    out
}

fn derive_errors(c: &Case) -> Vec<(String, String)> {
    let mut errors = Vec::new();
    let model = crate::model::model(&derive(c), &mut errors);
    assert!(
        model.is_none() && !errors.is_empty(),
        "{}: the derive accepts it",
        c.name
    );
    let mut out: Vec<_> = errors
        .iter()
        .map(|e| {
            let at = e.span().source_text().unwrap_or_default();
            (e.to_string(), derive_key(value_text(&at)))
        })
        .collect();
    out.sort();
    out
}

/// A value as written, without quotes.
fn value_text(s: &str) -> String {
    s.trim().trim_matches('"').to_owned()
}

/// The YAML value an error is at; a collection (`[...]`, `{...}`) or a flag by its key,
/// as the derive writes those `key(...)` or `key` and spans the key.
fn yaml_value(text: &str, offset: usize, len: usize) -> String {
    let at = text.get(offset..offset + len).unwrap_or("");
    if !at.starts_with(['[', '{']) && !matches!(at, "true" | "false") {
        return value_text(at);
    }
    let before = text[..offset].trim_end_matches([' ', '[', ':']);
    let key_start = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    before[key_start..].to_owned()
}

/// The derive's key for what YAML keys differently: `mesh(cp0, cp1)` is `cp: [cp0, cp1]`.
fn derive_key(s: String) -> String {
    if s == "mesh" {
        "cp".to_owned()
    } else {
        s
    }
}

#[test]
fn both_front_ends_give_the_same_errors_at_the_same_values() {
    let mut differ = Vec::new();
    for c in CASES {
        let (from_yaml, from_derive) = (yaml_errors(c), derive_errors(c));
        if from_derive != from_yaml {
            differ.push(format!(
                "{}:\n  derive: {from_derive:?}\n  YAML:   {from_yaml:?}",
                c.name
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "errors (message, value) differ between the front ends:\n{}",
        differ.join("\n")
    );
}
