//! Domain-parallel (ShardTensor) specs: the same inference as CP specs, and the
//! validation of what domain-parallel users get wrong, each at its YAML line:col.

mod support;

use featshard_spec::compile_str;
use featshard_spec::ir::Placement;
use featshard_spec::plan::{chunk_sizes, FeaturePlan, Padding, SplitPlan};
use support::assert_error;

/// Lines 1-11; features start on line 12.
const BASE: &str = "\
version: 1
module: field
mesh:
  domain: [domain]
  uneven: [domain]
  dp: ddp
semantics:
  batch: {shard: false, batch: true}
  height: {shard: true}
  width: {shard: false}
features:
";

fn placements(text: &str, name: &str) -> Vec<Placement> {
    let (_, plan) =
        compile_str("spec.yaml", text).unwrap_or_else(|d| panic!("{}", d.render_plain()));
    match &plan.features[name] {
        FeaturePlan::Tensor(t) => t.placements.clone(),
        FeaturePlan::Metadata { .. } => panic!("{name} is metadata"),
    }
}

#[test]
fn bchw_shards_h_over_the_domain_axis_and_labels_replicate() {
    let text = format!(
        "{BASE}  x: {{axes: [batch, 4, height, width], dtype: float32}}\n  y: {{axes: [batch, 4, height, width], dtype: float32, replicated: true}}\n"
    );
    assert_eq!(placements(&text, "x"), vec![Placement::Shard(2)]);
    assert_eq!(placements(&text, "y"), vec![Placement::Replicate]);
    let (_, plan) = compile_str("spec.yaml", &text).unwrap();
    assert_eq!(
        plan.mesh.split,
        SplitPlan::Domain {
            axes: vec!["domain".to_owned()],
            uneven: vec![true]
        }
    );
    // Uneven axes are not padded; the batch semantic is marked.
    assert_eq!(plan.semantics["height"].padding, Padding::None);
    assert!(plan.semantics["batch"].batch);
}

#[test]
fn an_even_domain_axis_pads_to_a_multiple() {
    let text = BASE.replace("  uneven: [domain]\n", "")
        + "  x: {axes: [batch, height, width], dtype: float32}\n";
    let (_, plan) = compile_str("spec.yaml", &text).unwrap();
    assert_eq!(
        plan.semantics["height"].padding,
        Padding::Multiple {
            mesh_axes: vec![0],
            window: None,
            whole_windows: false,
        }
    );
}

#[test]
fn a_2d_domain_mesh_tiles_two_spatial_axes() {
    let text = "\
version: 1
module: volume
mesh:
  domain: [dx, dy]
  uneven: [dx, dy]
semantics:
  batch: {shard: false, batch: true}
  lon: {shard: true}
  lat: {shard: true}
features:
  u: {axes: [batch, lon, lat, 3], dtype: float32}
";
    assert_eq!(
        placements(text, "u"),
        vec![Placement::Shard(1), Placement::Shard(2)]
    );
}

#[test]
fn more_sharded_axes_than_domain_axes() {
    let text = BASE.replace("width: {shard: false}", "width: {shard: true}")
        + "  x: {axes: [batch, height, width], dtype: float32}\n";
    assert_error(
        &text,
        &[
            "spec.yaml:12:",
            "feature `x`, axis 2 (width)",
            "the 1 domain mesh axes",
        ],
    );
}

#[test]
fn split_boundaries_that_would_not_line_up() {
    // `height` is the first sharded axis of `a` (mesh axis dx) but the second of `b`
    // (mesh axis dy): their shards of `height` would not coincide.
    let text = "\
version: 1
module: volume
mesh:
  domain: [dx, dy]
semantics:
  batch: {shard: false, batch: true}
  height: {shard: true}
  width: {shard: true}
features:
  a: {axes: [batch, height, width], dtype: float32}
  b: {axes: [batch, width, height], dtype: float32}
";
    assert_error(
        text,
        &[
            "spec.yaml:11:",
            "feature `b`",
            "`height` is split over mesh axis `dy` here but over `dx` in feature `a`",
        ],
    );
}

#[test]
fn a_sharded_batch_axis() {
    let text = BASE.replace(
        "batch: {shard: false, batch: true}",
        "batch: {shard: true, batch: true}",
    ) + "  x: {axes: [batch, height], dtype: float32}\n";
    assert_error(
        &text,
        &[
            "spec.yaml:8:",
            "semantic `batch`",
            "a batch semantic is never sharded",
        ],
    );
}

#[test]
fn two_batch_axes() {
    let text = format!("{BASE}  x: {{axes: [batch, height, batch], dtype: float32}}\n");
    assert_error(
        &text,
        &[
            "spec.yaml:12:",
            "feature `x`, axis 2 (batch)",
            "at most one batch axis",
        ],
    );
}

#[test]
fn uneven_names_an_unknown_axis() {
    let text = BASE.replace("uneven: [domain]", "uneven: [domian]")
        + "  x: {axes: [height], dtype: float32}\n";
    assert_error(
        &text,
        &[
            "spec.yaml:5:",
            "`uneven` names `domian`, which is not a domain axis",
        ],
    );
}

#[test]
fn cp_and_domain_together() {
    let text = BASE
        .replace(
            "  domain: [domain]\n",
            "  domain: [domain]\n  cp: [cp0, cp1]\n",
        )
        .replace("  uneven: [domain]\n", "")
        + "  x: {axes: [height], dtype: float32}\n";
    assert_error(
        &text,
        &[
            "spec.yaml:4:",
            "either `cp` axes (DTensor) or `domain` axes (ShardTensor)",
        ],
    );
}

#[test]
fn three_domain_axes() {
    let text = BASE
        .replace("domain: [domain]", "domain: [a, b, c]")
        .replace("uneven: [domain]", "uneven: []")
        + "  x: {axes: [height], dtype: float32}\n";
    assert_error(
        &text,
        &["spec.yaml:4:", "a domain mesh has one or two axes, 3 given"],
    );
}

#[test]
fn cp_only_constructs_in_a_domain_spec() {
    let owner = BASE.replace(
        "  width: {shard: false}\n",
        "  width: {shard: false}\n  cells: {shard: true, owner: height, counts: n}\n",
    ) + "  n: {axes: [height], dtype: int64}\n";
    assert_error(
        &owner,
        &[
            "spec.yaml:11:",
            "semantic `cells`",
            "owner-partitioned semantics are for context-parallel",
        ],
    );
    let index = format!(
        "{BASE}  i: {{axes: [height], dtype: int64, index: {{of: height, scope: shard_local}}}}\n"
    );
    assert_error(&index, &["spec.yaml:12:", "feature `i`", "index remapping"]);
}

#[test]
fn batch_in_a_cp_spec() {
    let text = "\
version: 1
module: demo
mesh:
  cp: [cp0, cp1]
semantics:
  batch: {shard: false, batch: true}
  tokens: {shard: true}
features:
  x: {axes: [tokens], dtype: float32}
";
    assert_error(
        text,
        &[
            "spec.yaml:6:",
            "semantic `batch`",
            "`batch: true` declares the per-domain-group batch axis",
        ],
    );
}

#[test]
fn uneven_in_a_cp_spec() {
    let text = "\
version: 1
module: demo
mesh:
  cp: [cp0, cp1]
  uneven: [cp0]
semantics:
  tokens: {shard: true}
features:
  x: {axes: [tokens], dtype: float32}
";
    assert_error(text, &["spec.yaml:5:", "`uneven` applies to `domain` axes"]);
}

#[test]
fn chunk_sizes_are_torch_chunk_pieces_or_none_when_a_shard_is_empty() {
    assert_eq!(chunk_sizes(7, 3), Some(vec![3, 3, 1]));
    assert_eq!(chunk_sizes(8, 4), Some(vec![2, 2, 2, 2]));
    assert_eq!(chunk_sizes(5, 4), None); // chunks of 2: 2, 2, 1, -
    assert_eq!(chunk_sizes(2, 3), None);
    for ranks in 1..8 {
        for len in 0..50 {
            if let Some(v) = chunk_sizes(len, ranks) {
                assert_eq!(v.iter().sum::<usize>(), len);
                assert_eq!(v.len(), ranks);
                assert!(v.iter().all(|&n| n > 0));
            }
        }
    }
}

#[test]
fn the_examples_compile() {
    for name in ["weather", "pointcloud", "volume"] {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("examples/{name}.yaml"));
        featshard_spec::compile_file(&path)
            .unwrap_or_else(|d| panic!("{name}: {}", d.render_plain()));
    }
}

#[test]
fn resolving_lengths_that_leave_a_shard_empty_names_the_feature_and_axis() {
    let text = format!("{BASE}  x: {{axes: [batch, height, width], dtype: float32}}\n");
    let (_, plan) = compile_str("spec.yaml", &text).unwrap();
    let lengths = |h: usize| featshard_spec::plan::Lengths {
        sizes: [("batch", 1), ("height", h), ("width", 5)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        ..Default::default()
    };
    let e = plan.resolve(mesh(&[3]), &lengths(2), None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "feature `x`, axis 1 (height): 2 items over 3 ranks would leave a shard empty on mesh axis `domain`"
    );
    let r = plan.resolve(mesh(&[3]), &lengths(7), None).unwrap();
    assert_eq!(
        r.features["x"].local_shape,
        vec![1, 3, 5],
        "the largest of 3, 3, 1"
    );
}

/// A 2D domain: `xs` uneven over dx, `ys` padded over dy; lines 1-11.
const STENCIL: &str = "\
version: 1
module: field
mesh:
  domain: [dx, dy]
  uneven: [dx]
semantics:
  batch: {shard: false, batch: true}
  xs: {shard: true, halo: 2}
  ys: {shard: true, stride: 2, halo: 3}
features:
  u: {axes: [batch, xs, ys], dtype: float32}
";

fn stencil_lengths(xs: usize, ys: usize) -> featshard_spec::plan::Lengths {
    featshard_spec::plan::Lengths {
        sizes: [("batch", 1), ("xs", xs), ("ys", ys)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn stride_and_halo_pad_an_even_axis_until_every_shard_meets_them() {
    let (_, plan) = compile_str("spec.yaml", STENCIL).unwrap();
    // (ys, dy ranks) -> padded ys: a multiple of 2 x ranks, at least 3 per shard.
    for (ys, ranks, want) in [(5, 2, 8), (9, 2, 12), (1, 2, 8), (5, 3, 12), (13, 1, 14)] {
        let r = plan
            .resolve(mesh(&[3, ranks]), &stencil_lengths(8, ys), None)
            .unwrap();
        assert_eq!(r.padded["ys"], want, "ys = {ys} over {ranks} ranks");
        let shard = want / ranks;
        assert!(shard % 2 == 0 && shard >= 3, "shard {shard}");
    }
}

#[test]
fn an_uneven_axis_whose_chunks_break_the_halo_is_refused_naming_axis_mesh_and_lengths() {
    let (_, plan) = compile_str("spec.yaml", STENCIL).unwrap();
    let e = plan
        .resolve(mesh(&[3, 2]), &stencil_lengths(7, 4), None)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "feature `u`, axis 1 (xs): 7 items over 3 ranks of mesh axis `dx` give shards [3, 3, 1], \
         but `xs` needs every shard at least 2 long; no uneven layout exists: pad the axis \
         (drop `dx` from `uneven`) or change the length or the mesh"
    );
    let r = plan
        .resolve(mesh(&[3, 2]), &stencil_lengths(8, 4), None)
        .unwrap();
    assert_eq!(r.features["u"].local_shape, vec![1, 3, 4], "chunks 3, 3, 2");
    // A stride on an uneven axis: 7 over 2 ranks gives 4 and 3.
    let strided = STENCIL.replace("xs: {shard: true, halo: 2}", "xs: {shard: true, stride: 2}");
    let (_, plan) = compile_str("spec.yaml", &strided).unwrap();
    let e = plan
        .resolve(mesh(&[2, 1]), &stencil_lengths(7, 4), None)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("give shards [4, 3], but `xs` needs every shard a multiple of 2;"),
        "{e}"
    );
    assert!(plan
        .resolve(mesh(&[2, 1]), &stencil_lengths(8, 4), None)
        .is_ok());
}

#[test]
fn stride_and_halo_where_they_cannot_apply_are_spec_errors() {
    assert_error(
        &STENCIL.replace("stride: 2, halo: 3", "stride: 0, halo: 3"),
        &["spec.yaml:9:", "semantic `ys`", "stride must be at least 1"],
    );
    assert_error(
        &STENCIL.replace(
            "batch: {shard: false, batch: true}",
            "batch: {shard: false, batch: true, halo: 1}",
        ),
        &[
            "spec.yaml:7:",
            "semantic `batch`",
            "`halo` constrains shards, but this semantic is not sharded",
        ],
    );
    assert_error(
        &STENCIL.replace("halo: 3}", "halo: 300000000}"),
        &[
            "spec.yaml:9:",
            "semantic `ys`",
            "halo 300000000 is more than the length limit",
        ],
    );
    let cp = "\
version: 1
module: cp
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true, stride: 4}
  atoms: {shard: true, owner: tokens, counts: n, halo: 2}
features:
  n: {axes: [tokens], dtype: int64}
  x: {axes: [atoms], dtype: float32}
";
    assert_error(
        cp,
        &[
            "spec.yaml:5:",
            "semantic `tokens`",
            "`stride` and `halo` apply to domain-parallel specs",
        ],
    );
    assert_error(
        cp,
        &[
            "spec.yaml:6:",
            "semantic `atoms`",
            "`halo` applies to axes a mesh splits directly, not to owned items",
        ],
    );
}

#[test]
fn parameters_and_outputs_are_placed_like_the_inputs_and_are_no_inputs() {
    let text = format!(
        "{BASE}  x: {{axes: [batch, 4, height, width], dtype: float32}}\n  pos: {{axes: [height, width, 8], dtype: float32, parameter: true}}\n"
    );
    assert_eq!(placements(&text, "pos"), vec![Placement::Shard(0)]);
    let (_, plan) = compile_str("spec.yaml", &text).unwrap();
    let FeaturePlan::Tensor(t) = &plan.features["pos"] else {
        panic!("pos is metadata")
    };
    assert!(t.parameter);
    let FeaturePlan::Tensor(x) = &plan.features["x"] else {
        panic!("x is metadata")
    };
    assert!(!x.parameter && !x.output);
    let text = text.replace("parameter: true", "output: true");
    assert_eq!(placements(&text, "pos"), vec![Placement::Shard(0)]);
    let (_, plan) = compile_str("spec.yaml", &text).unwrap();
    assert!(matches!(&plan.features["pos"], FeaturePlan::Tensor(t) if t.output && !t.parameter));
}

#[test]
fn parameters_where_they_cannot_be() {
    let cp = "\
version: 1
module: demo
mesh:
  cp: [cp0, cp1]
semantics:
  tokens: {shard: true}
features:
  x: {axes: [tokens], dtype: float32, parameter: true}
";
    assert_error(
        cp,
        &[
            "spec.yaml:8:",
            "feature `x`",
            "model parameters are placed for domain-parallel (ShardTensor) specs",
        ],
    );
    let mask =
        format!("{BASE}  m: {{axes: [height], dtype: bool, mask: height, parameter: true}}\n");
    assert_error(
        &mask,
        &[
            "spec.yaml:12:",
            "feature `m`",
            "holds values, not a mask or indices",
        ],
    );
    let optional =
        format!("{BASE}  p: {{axes: [height], dtype: float32, optional: true, parameter: true}}\n");
    assert_error(
        &optional,
        &[
            "spec.yaml:12:",
            "feature `p`",
            "cannot be optional or derived",
        ],
    );
    let both =
        format!("{BASE}  p: {{axes: [height], dtype: float32, parameter: true, output: true}}\n");
    assert_error(
        &both,
        &[
            "spec.yaml:12:",
            "feature `p`",
            "a model parameter or a model output, not both",
        ],
    );
    let output = cp.replace("parameter: true", "output: true");
    assert_error(
        &output,
        &[
            "spec.yaml:8:",
            "feature `x`",
            "model outputs are placed for domain-parallel",
        ],
    );
    let metadata = format!("{BASE}  p: {{metadata: true, parameter: true}}\n");
    assert_error(
        &metadata,
        &["spec.yaml:12:", "feature `p`", "`parameter` does not apply"],
    );
}

/// On volume (`dx` uneven, `dy` even): every rank's window is its `torch.chunk` piece
/// on `xs` and its equal block on `ys`, and the windows of all ranks tile the global
/// shape exactly once; a coordinate off the mesh or an empty shard has no window.
#[test]
fn domain_windows_are_chunk_pieces_and_even_blocks_that_tile_the_global_shape() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/volume.yaml");
    let (_, plan) = featshard_spec::compile_file(&path).unwrap();
    let FeaturePlan::Tensor(velocity) = &plan.features["velocity"] else {
        panic!("velocity is a tensor")
    };
    for sizes in [[1, 1], [2, 1], [3, 2], [2, 3], [4, 4]] {
        let mesh = mesh(&sizes);
        for xs in sizes[0]..sizes[0] + 9 {
            let Some(pieces) = chunk_sizes(xs, sizes[0]) else {
                continue;
            };
            let ys = plan.padded_length("ys", xs + 1, mesh);
            let global = [1, xs, ys, 3];
            let mut cover = vec![vec![0u8; ys]; xs];
            for c in mesh.coords() {
                let (i, j) = (c.get(0), c.get(1));
                {
                    let w = plan.domain_window(velocity, &global, mesh, c).unwrap();
                    assert_eq!(
                        w[1],
                        (pieces[..i].iter().sum(), pieces[i]),
                        "{mesh:?} xs {xs}"
                    );
                    assert_eq!(w[2], (j * ys / sizes[1], ys / sizes[1]));
                    assert_eq!((w[0], w[3]), ((0, 1), (0, 3)));
                    for row in &mut cover[w[1].0..w[1].0 + w[1].1] {
                        row[w[2].0..w[2].0 + w[2].1]
                            .iter_mut()
                            .for_each(|c| *c += 1);
                    }
                }
            }
            assert!(cover.iter().flatten().all(|&c| c == 1), "{mesh:?} xs {xs}");
            assert!(mesh.coord_at(&[sizes[0], 0]).is_err(), "off the mesh");
        }
    }
    assert_eq!(
        plan.domain_window(
            velocity,
            &[1, 2, 4, 3],
            mesh(&[3, 1]),
            mesh(&[3, 1]).coord(0)
        ),
        None
    );
}

fn mesh(sizes: &[usize]) -> featshard_spec::Mesh {
    featshard_spec::Mesh::new(sizes).unwrap()
}

/// ShardTensor's sharding shapes are each rank's `torch.chunk` piece along the axis
/// that splits a feature; a padded output is cut back to the sample's lengths by its
/// declared semantics, and a semantic the spec lacks or an axis count that does not
/// match is refused by name.
#[test]
fn sharding_shapes_are_chunk_pieces_and_outputs_cut_back_to_their_lengths() {
    let text = format!("{BASE}  x: {{axes: [batch, height, width], dtype: float32}}\n");
    let (_, plan) = compile_str("spec.yaml", &text).unwrap();
    let t = match &plan.features["x"] {
        FeaturePlan::Tensor(t) => t,
        FeaturePlan::Metadata { .. } => unreachable!(),
    };
    let m = mesh(&[3]);
    let along = plan.sharding_shapes(t, &[1, 7, 5], m, m.coord(1)).unwrap();
    assert_eq!(along.len(), 1);
    assert_eq!(along[&0], vec![vec![1, 3, 5], vec![1, 3, 5], vec![1, 1, 5]]);
    assert_eq!(plan.sharding_shapes(t, &[1, 2, 5], m, m.coord(0)), None);
    let axes: Vec<Option<String>> = t.axes.iter().map(|a| a.semantic.clone()).collect();
    let lengths = [("height".to_owned(), 6)].into();
    assert_eq!(
        plan.real_shape(&axes, &[1, 9, 5], &lengths),
        Ok(vec![1, 6, 5])
    );
    let e = plan
        .real_shape(&axes[..2], &[1, 9, 5], &lengths)
        .unwrap_err();
    assert!(e.contains("2 axis semantics for shape [1, 9, 5]"), "{e}");
    let odd = vec![None, Some("depth".to_owned()), None];
    let e = plan.real_shape(&odd, &[1, 9, 5], &lengths).unwrap_err();
    assert!(
        e.contains("axis 1: semantic `depth` is not declared"),
        "{e}"
    );
    let e = plan.real_shape(&axes, &[1, 4, 5], &lengths).unwrap_err();
    assert!(e.contains("more than the 4"), "{e}");
}
