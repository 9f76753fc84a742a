//! Properties of the inference and padding rules over random specs, meshes and lengths.

use std::collections::BTreeMap;

use featshard::spec::compile_str;
use featshard::spec::plan::Split;
use featshard::spec::plan::{spread_evenly, FeaturePlan, Lengths, Ownership, Padding, RootCounts};
use proptest::prelude::*;

/// A random spec: sharded and unsharded semantics, an owner tree (`items` owned by
/// the first semantic through `item_counts`), features with random axes.
#[derive(Debug, Clone)]
struct RandomSpec {
    yaml: String,
    semantics: Vec<String>,
}

fn axis_choices(n_sem: usize) -> impl Strategy<Value = Vec<usize>> {
    // Index < n_sem + 1: a semantic ("items" is index n_sem); larger: a channel axis.
    prop::collection::vec(0..n_sem + 3, 0..5)
}

fn random_spec() -> impl Strategy<Value = RandomSpec> {
    (1usize..4, prop::collection::vec(any::<bool>(), 3), any::<bool>())
        .prop_flat_map(|(n_sem, sharded, owned)| {
            let features = prop::collection::vec(axis_choices(n_sem), 1..10);
            (Just(n_sem), Just(sharded), Just(owned), features, any::<bool>())
        })
        .prop_map(|(n_sem, sharded, owned, features, block_map)| {
            let mut sem_names: Vec<String> = (0..n_sem).map(|i| format!("s{i}")).collect();
            // s0 is always sharded so the owner tree has a sharded root.
            let is_sharded = |i: usize| i == 0 || sharded[i];
            let mut yaml = String::from(
                "version: 1\nmodule: random_spec\nmesh: {cp: [cp0, cp1], dp: dp}\nsemantics:\n",
            );
            for (i, s) in sem_names.iter().enumerate() {
                yaml.push_str(&format!("  {s}: {{shard: {}}}\n", is_sharded(i)));
            }
            if owned {
                yaml.push_str("  items: {shard: true, owner: s0, counts: item_counts}\n");
                sem_names.push("items".into());
            }
            yaml.push_str("features:\n");
            if owned {
                yaml.push_str("  item_counts: {axes: [s0], dtype: int64}\n");
                if block_map {
                    yaml.push_str(
                        "  item_to_s0: {axes: [items, s0], dtype: int64, coshard: [{axis: 1, follows: 0}], index: {of: s0, scope: shard_local, one_hot: 1}}\n",
                    );
                }
            }
            for (k, axes) in features.iter().enumerate() {
                let mut names = Vec::new();
                let mut sharded_axes = Vec::new();
                for (d, &a) in axes.iter().enumerate() {
                    if a < sem_names.len() {
                        let s = &sem_names[a];
                        let sharded = s == "items" || is_sharded(a);
                        if sharded {
                            sharded_axes.push(d);
                        }
                        names.push(s.clone());
                    } else {
                        names.push(format!("{}", a - sem_names.len() + 1));
                    }
                }
                // More sharded axes than mesh axes needs a declared resolution.
                let extra: Vec<String> = sharded_axes.iter().skip(2).map(|d| d.to_string()).collect();
                let resolve = if extra.is_empty() {
                    String::new()
                } else {
                    format!(", replicate_axes: [{}]", extra.join(", "))
                };
                yaml.push_str(&format!(
                    "  f{k}: {{axes: [{}], dtype: float32{resolve}}}\n",
                    names.join(", ")
                ));
            }
            RandomSpec {
                yaml,
                semantics: sem_names,
            }
        })
}

fn lengths_for(spec: &RandomSpec, base: &[usize], counts_seed: &[usize]) -> Lengths {
    let mut l = Lengths::default();
    for (i, s) in spec.semantics.iter().enumerate() {
        if s != "items" {
            l.sizes.insert(s.clone(), base[i % base.len()]);
        }
    }
    if spec.semantics.iter().any(|s| s == "items") {
        let owners = l.sizes["s0"];
        let counts: Vec<usize> = (0..owners)
            .map(|i| counts_seed[i % counts_seed.len()])
            .collect();
        l.sizes.insert("items".into(), counts.iter().sum());
        l.counts.insert("items".into(), RootCounts::Each(counts));
    }
    l
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// `resolve` (what `explain` prints) counts owner blocks from per-owner counts, not
    /// from every item's position: the same padded lengths and blocks as the sample
    /// layout; and an even spread, which needs no list, the same as its list.
    #[test]
    fn resolved_blocks_equal_the_layouts_and_an_even_spread_needs_no_list(
        spec in random_spec(),
        mesh in (1usize..6, 1usize..6),
        base in prop::collection::vec(0usize..40, 3),
        counts_seed in prop::collection::vec(0usize..7, 1..8),
    ) {
        let (_, plan) = compile_str("random.yaml", &spec.yaml)
            .map_err(|d| TestCaseError::fail(format!("{}\n{}", d.render_plain(), spec.yaml)))?;
        let mesh = featshard::spec::Mesh::new(&[mesh.0, mesh.1]).unwrap();
        let mut lengths = lengths_for(&spec, &base, &counts_seed);
        let resolved = plan.resolve(mesh, &lengths, None)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let ownership: BTreeMap<String, Ownership> = lengths.counts.iter().map(|(s, c)| match c {
            RootCounts::Each(c) => (s.clone(), Ownership::Counts(c.clone())),
            RootCounts::Even => unreachable!("lengths_for lists counts"),
        }).collect();
        let layout = plan.layout(mesh, &lengths.sizes, &ownership)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&resolved.padded, &layout.padded);
        prop_assert_eq!(&resolved.blocks, &layout.blocks);
        if let (Some(&n), Some(&owners)) = (lengths.sizes.get("items"), lengths.sizes.get("s0")) {
            lengths.counts.insert("items".into(), RootCounts::Even);
            let even = plan.resolve(mesh, &lengths, None)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            lengths.counts.insert("items".into(), RootCounts::Each(spread_evenly(n, owners)));
            let listed = plan.resolve(mesh, &lengths, None)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(even, listed);
        }
    }

    #[test]
    fn padded_shapes_divide_by_their_mesh_axes_and_agree_across_features(
        spec in random_spec(),
        mesh in (1usize..6, 1usize..6),
        base in prop::collection::vec(0usize..40, 3),
        counts_seed in prop::collection::vec(0usize..7, 1..8),
    ) {
        let (_, plan) = compile_str("random.yaml", &spec.yaml)
            .map_err(|d| TestCaseError::fail(format!("{}\n{}", d.render_plain(), spec.yaml)))?;
        let mesh = featshard::spec::Mesh::new(&[mesh.0, mesh.1]).unwrap();
        let lengths = lengths_for(&spec, &base, &counts_seed);
        let resolved = plan.resolve(mesh, &lengths, None)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;

        let mut padded_of: BTreeMap<String, usize> = BTreeMap::new();
        for (name, t) in plan.tensors() {
            let shapes = &resolved.features[name];
            prop_assert_eq!(t.placements.len(), 2);
            for (d, axis) in t.axes.iter().enumerate() {
                let (global, local, padded) =
                    (shapes.global_shape[d], shapes.local_shape[d], shapes.padded_shape[d]);
                prop_assert!(padded >= shapes.serial_shape[d]);
                match axis.split {
                    Split::Whole => prop_assert_eq!(local, global),
                    Split::Mesh { mesh_axis } => {
                        prop_assert_eq!(global % mesh.size(mesh_axis), 0, "{} axis {}", name, d);
                        prop_assert_eq!(local * mesh.size(mesh_axis), global);
                        prop_assert_eq!(t.placements[mesh_axis], featshard::spec::Placement::Shard(d));
                    }
                    Split::Follows { mesh_axis, .. } => {
                        prop_assert_eq!(padded % mesh.size(mesh_axis), 0);
                        prop_assert_eq!(local * mesh.size(mesh_axis), padded);
                    }
                }
                if let Some(s) = &axis.semantic {
                    // Equal semantics, equal padded lengths, in every feature.
                    let prev = *padded_of.entry(s.clone()).or_insert(padded);
                    prop_assert_eq!(prev, padded, "semantic {} padded differently in {}", s, name);
                }
            }
            // The DP rule: Shard(0) in front, every Shard(d) shifted by one.
            prop_assert_eq!(t.placements_dp[0], featshard::spec::Placement::Shard(0));
            for (cp, dp) in t.placements.iter().zip(&t.placements_dp[1..]) {
                match (cp, dp) {
                    (featshard::spec::Placement::Shard(a), featshard::spec::Placement::Shard(b)) => prop_assert_eq!(a + 1, *b),
                    (a, b) => prop_assert_eq!(a, b),
                }
            }
        }
        // Owner blocks: every block fits, and the layout splits evenly over every mesh
        // axis that shards the owned semantic.
        for (name, l) in &resolved.blocks {
            prop_assert!(l.block_counts.iter().all(|&c| c <= l.per_block));
            prop_assert_eq!(l.block_counts.iter().sum::<usize>(), lengths.sizes[name]);
            if let Padding::OwnerBlocks { mesh_axes, .. } = &plan.semantics[name].padding {
                for &m in mesh_axes {
                    prop_assert_eq!(l.blocks % mesh.size(m), 0);
                }
            }
        }
    }

    #[test]
    fn compiling_and_generating_twice_is_identical(spec in random_spec()) {
        let a = compile_str("random.yaml", &spec.yaml).map_err(|d| TestCaseError::fail(d.render_plain()))?;
        let b = compile_str("random.yaml", &spec.yaml).map_err(|d| TestCaseError::fail(d.render_plain()))?;
        prop_assert_eq!(&a.1, &b.1);
        let ga = featshard::codegen::generate(&a.1).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let gb = featshard::codegen::generate(&b.1).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(ga, gb);
        // Nothing is lost: every feature of the spec is in the plan, with its axes.
        prop_assert!(a.0.features.keys().eq(a.1.features.keys()));
        for (name, _, t) in a.0.tensors() {
            let FeaturePlan::Tensor(p) = &a.1.features[name] else {
                return Err(TestCaseError::fail(format!("{name} is not a tensor in the plan")));
            };
            prop_assert_eq!(p.axes.len(), t.axes.len());
        }
    }

    #[test]
    fn no_input_text_makes_the_compiler_panic(text in ".{0,300}") {
        let _ = compile_str("fuzz.yaml", &text);
    }
}
