//! `examples/boltz2.yaml` against the real Boltz-2 featurizer output it describes
//! (`tests/data/real/*.json`: every key the featurizer emits, with type, shape, dtype).

use std::collections::BTreeMap;
use std::path::PathBuf;

use featshard::spec::plan::{FeaturePlan, Plan};

const SAMPLES: [&str; 4] = [
    "prot60_nomsa",
    "prot60_smiles",
    "boltz_cp/prot60_nomsa",
    "boltz_cp/prot60_smiles",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn plan() -> Plan {
    featshard::spec::compile_file(&root().join("examples/boltz2.yaml"))
        .unwrap_or_else(|d| panic!("{}", d.render_plain()))
        .1
}

fn keys(sample: &str) -> serde_json::Map<String, serde_json::Value> {
    let path = root().join(format!("tests/data/real/{sample}.json"));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    doc["keys"].as_object().unwrap().clone()
}

#[test]
fn every_key_the_featurizer_emits_is_placed_dropped_or_metadata() {
    let plan = plan();
    let inference = &plan.workflows["inference"];
    for sample in SAMPLES {
        // Lengths of each semantic, as the tensors of this sample give them.
        let mut lengths: BTreeMap<String, (u64, String)> = BTreeMap::new();
        for (key, v) in keys(sample) {
            if v["type"] != "torch.Tensor" {
                assert!(
                    matches!(plan.features.get(&key), Some(FeaturePlan::Metadata { .. })),
                    "{sample}: `{key}` ({}) is not a tensor, so it must be metadata",
                    v["type"]
                );
                continue;
            }
            if plan.inputs.drop.contains(&key) {
                continue;
            }
            let Some(FeaturePlan::Tensor(t)) = plan.features.get(&key) else {
                panic!("{sample}: the spec has no tensor feature `{key}`");
            };
            assert!(
                inference.contains(&key),
                "{sample}: `{key}` is not in the inference workflow"
            );
            assert_eq!(v["dtype"], t.dtype.name(), "{sample}: `{key}` dtype");
            let shape: Vec<u64> = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap())
                .collect();
            assert_eq!(shape.len(), t.axes.len(), "{sample}: `{key}` rank");
            for (d, (a, &n)) in t.axes.iter().zip(&shape).enumerate() {
                match (&a.semantic, a.size) {
                    (None, Some(size)) => assert_eq!(n, size, "{sample}: `{key}` axis {d}"),
                    (Some(s), _) => {
                        let (len, first) = lengths.entry(s.clone()).or_insert((n, key.clone()));
                        assert_eq!(
                            n, *len,
                            "{sample}: `{key}` axis {d} ({s}) has length {n}, `{first}` has {len}"
                        );
                    }
                    (None, None) => unreachable!(),
                }
            }
        }
        for name in inference {
            let present = keys(sample).contains_key(name);
            match &plan.features[name] {
                FeaturePlan::Tensor(t) if !t.optional && t.derived.is_none() => {
                    assert!(
                        present,
                        "{sample}: required feature `{name}` is not emitted"
                    )
                }
                FeaturePlan::Tensor(t) if t.derived.is_some() => {
                    assert!(
                        !present,
                        "{sample}: `{name}` is emitted; it need not be derived"
                    )
                }
                _ => {}
            }
        }
    }
}

#[test]
fn the_two_featurizers_differ_only_in_the_owner_counts() {
    let pypi = keys("prot60_smiles");
    let cp = keys("boltz_cp/prot60_smiles");
    let only_cp: Vec<&String> = cp.keys().filter(|k| !pypi.contains_key(*k)).collect();
    let only_pypi: Vec<&String> = pypi.keys().filter(|k| !cp.contains_key(*k)).collect();
    assert_eq!(only_cp, ["atom_counts_per_token"]);
    assert!(only_pypi.is_empty());
    let FeaturePlan::Tensor(counts) = &plan().features["atom_counts_per_token"] else {
        panic!()
    };
    assert!(counts.optional, "boltz 2.2.1 does not emit it");
}
