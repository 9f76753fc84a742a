//! `#[derive(Features)]`: the same plan and tables as the YAML, and a runtime round
//! trip through the derived methods.
#![cfg(feature = "derive")]

use std::path::PathBuf;

use featshard::runtime::synthetic::{self, Shape};
use featshard::tch::Tensor;
use featshard::Features;

/// `examples/boltz2.yaml`'s inference workflow, written with field attributes only.
#[derive(Features)]
#[featshard(module = "boltz2_placements", mesh(cp_axis_0, cp_axis_1, dp = dp), workflows(inference))]
#[featshard(
    semantic(tokens, shard, incoming_pads(mask = token_pad_mask)),
    semantic(atoms, shard, owner = tokens, counts = atom_counts_per_token, map = atom_to_token,
             window = 32, incoming_pads(mask = atom_pad_mask)),
    semantic(rset, shard, owner = atoms, map = r_set_to_rep_atom, unowned_rows = pad),
    semantic(msa, shard, on_1d = whole),
    semantic(ensemble),
    semantic(disto_ensemble),
    semantic(templates),
    semantic(rdkit_bounds), semantic(chiral), semantic(stereo), semantic(planar_bonds),
    semantic(planar_ring_5), semantic(planar_ring_6), semantic(connections),
    semantic(chain_pairs), semantic(contacts),
    drop(token_to_center_atom, ensemble_ref_idxs),
    other_keys = refuse
)]
struct Boltz2Inference {
    #[featshard(axes(tokens), dtype = int64, index(of = tokens, scope = serial))]
    token_index: Tensor,
    #[featshard(axes(tokens), dtype = int64)]
    residue_index: Tensor,
    #[featshard(axes(tokens), dtype = int64)]
    asym_id: Tensor,
    #[featshard(axes(tokens), dtype = int64)]
    entity_id: Tensor,
    #[featshard(axes(tokens), dtype = int64)]
    sym_id: Tensor,
    #[featshard(axes(tokens), dtype = int64, range(0, 3))]
    mol_type: Tensor,
    #[featshard(axes(tokens, 33), dtype = int64, one_hot = 1)]
    res_type: Tensor,
    #[featshard(axes(tokens, 3), dtype = float32)]
    disto_center: Tensor,
    #[featshard(axes(tokens), dtype = float32, mask(tokens))]
    token_pad_mask: Tensor,
    #[featshard(axes(tokens), dtype = float32, mask(tokens))]
    token_resolved_mask: Tensor,
    #[featshard(axes(tokens), dtype = float32, mask(tokens))]
    token_disto_mask: Tensor,
    #[featshard(axes(tokens), dtype = float32)]
    cyclic_period: Tensor,
    #[featshard(axes(tokens), dtype = int64)]
    method_feature: Tensor,
    #[featshard(axes(tokens), dtype = int64)]
    modified: Tensor,
    #[featshard(axes(tokens), dtype = int64)]
    atom_counts_per_token: Option<Tensor>,
    #[featshard(axes(tokens), dtype = float32)]
    deletion_mean: Tensor,
    #[featshard(axes(tokens, 33), dtype = float32)]
    profile: Tensor,
    #[featshard(axes(tokens), dtype = float32, mask(tokens))]
    affinity_token_mask: Tensor,
    #[featshard(axes(tokens, tokens, 1), dtype = float32, sparse)]
    token_bonds: Tensor,
    #[featshard(axes(tokens, tokens), dtype = int64, sparse)]
    type_bonds: Tensor,
    #[featshard(axes(tokens, tokens), dtype = float32, mask(tokens), derive(outer(token_pad_mask)))]
    token_pair_pad_mask: Option<Tensor>,
    #[featshard(axes(tokens, tokens, 5), dtype = int64, one_hot = 2)]
    contact_conditioning: Tensor,
    #[featshard(axes(tokens, tokens), dtype = float32, sparse)]
    contact_threshold: Tensor,
    #[featshard(axes(tokens, tokens, disto_ensemble, 64), dtype = float32, one_hot = 3)]
    disto_target: Tensor,
    #[featshard(axes(msa, tokens), dtype = int64, pad = 1, range(0, 32))]
    msa: Tensor,
    #[featshard(axes(msa, tokens), dtype = float32)]
    msa_paired: Tensor,
    #[featshard(axes(msa, tokens), dtype = float32)]
    deletion_value: Tensor,
    #[featshard(axes(msa, tokens), dtype = bool)]
    has_deletion: Tensor,
    #[featshard(axes(msa, tokens), dtype = int64, mask(msa, tokens))]
    msa_mask: Tensor,
    #[featshard(axes(atoms, 3), dtype = float32)]
    ref_pos: Tensor,
    #[featshard(axes(atoms), dtype = float32)]
    ref_charge: Tensor,
    #[featshard(axes(atoms), dtype = float32)]
    bfactor: Tensor,
    #[featshard(axes(atoms), dtype = float32)]
    plddt: Tensor,
    #[featshard(axes(atoms), dtype = bool, mask(atoms))]
    atom_resolved_mask: Tensor,
    #[featshard(axes(atoms), dtype = float32, mask(atoms))]
    atom_pad_mask: Tensor,
    #[featshard(axes(atoms, 128), dtype = int64, one_hot = 1)]
    ref_element: Tensor,
    #[featshard(axes(atoms, 4, 64), dtype = int64, one_hot = 2)]
    ref_atom_name_chars: Tensor,
    #[featshard(axes(atoms), dtype = int64)]
    ref_space_uid: Tensor,
    #[featshard(axes(atoms), dtype = int64)]
    ref_chirality: Tensor,
    #[featshard(axes(atoms, 17), dtype = int64, one_hot = 1)]
    atom_backbone_feat: Tensor,
    #[featshard(axes(atoms, atoms), dtype = float32, mask(atoms))]
    pair_mask: Option<Tensor>,
    #[featshard(axes(atoms, tokens), dtype = int64, coshard(axis = 1, follows = 0), index(of = tokens, scope = shard_local, one_hot = 1))]
    atom_to_token: Tensor,
    #[featshard(axes(tokens, atoms), dtype = int64, coshard(axis = 1, follows = 0), index(of = atoms, scope = shard_local, one_hot = 1))]
    token_to_rep_atom: Tensor,
    #[featshard(axes(rset, atoms), dtype = int64, coshard(axis = 1, follows = 0), index(of = atoms, scope = shard_local, one_hot = 1))]
    r_set_to_rep_atom: Tensor,
    #[featshard(axes(ensemble, atoms, 3), dtype = float32)]
    coords: Tensor,
    #[featshard(axes(ensemble, tokens, 3), dtype = int64, index(of = atoms, scope = padded_global))]
    frames_idx: Tensor,
    #[featshard(axes(ensemble, tokens), dtype = bool, mask(tokens))]
    frame_resolved_mask: Tensor,
    #[featshard(axes(ensemble, tokens, 3), dtype = float32)]
    disto_coords_ensemble: Tensor,
    #[featshard(axes(templates, tokens, 33), dtype = int64, one_hot = 2)]
    template_restype: Tensor,
    #[featshard(axes(templates, tokens, 3, 3), dtype = float32)]
    template_frame_rot: Tensor,
    #[featshard(axes(templates, tokens, 3), dtype = float32)]
    template_frame_t: Tensor,
    #[featshard(axes(templates, tokens, 3), dtype = float32)]
    template_cb: Tensor,
    #[featshard(axes(templates, tokens, 3), dtype = float32)]
    template_ca: Tensor,
    #[featshard(axes(templates, tokens), dtype = float32, mask(tokens))]
    template_mask_cb: Tensor,
    #[featshard(axes(templates, tokens), dtype = float32, mask(tokens))]
    template_mask_frame: Tensor,
    #[featshard(axes(templates, tokens), dtype = float32, mask(tokens))]
    template_mask: Tensor,
    #[featshard(axes(templates, tokens), dtype = float32)]
    visibility_ids: Tensor,
    #[featshard(axes(templates, tokens), dtype = int64)]
    query_to_template: Tensor,
    // Constraint lists (optional, ids remapped into the padded atom layout).
    #[featshard(axes(2, rdkit_bounds), dtype = int64, pad = -1, index(of = atoms, scope = padded_global))]
    rdkit_bounds_index: Option<Tensor>,
    #[featshard(axes(rdkit_bounds), dtype = bool)]
    rdkit_bounds_bond_mask: Option<Tensor>,
    #[featshard(axes(rdkit_bounds), dtype = bool)]
    rdkit_bounds_angle_mask: Option<Tensor>,
    #[featshard(axes(rdkit_bounds), dtype = float32)]
    rdkit_upper_bounds: Option<Tensor>,
    #[featshard(axes(rdkit_bounds), dtype = float32)]
    rdkit_lower_bounds: Option<Tensor>,
    #[featshard(axes(4, chiral), dtype = int64, pad = -1, index(of = atoms, scope = padded_global))]
    chiral_atom_index: Option<Tensor>,
    #[featshard(axes(chiral), dtype = bool)]
    chiral_reference_mask: Option<Tensor>,
    #[featshard(axes(chiral), dtype = bool)]
    chiral_atom_orientations: Option<Tensor>,
    #[featshard(axes(4, stereo), dtype = int64, pad = -1, index(of = atoms, scope = padded_global))]
    stereo_bond_index: Option<Tensor>,
    #[featshard(axes(stereo), dtype = bool)]
    stereo_reference_mask: Option<Tensor>,
    #[featshard(axes(stereo), dtype = bool)]
    stereo_bond_orientations: Option<Tensor>,
    #[featshard(axes(6, planar_bonds), dtype = int64, pad = -1, index(of = atoms, scope = padded_global))]
    planar_bond_index: Option<Tensor>,
    #[featshard(axes(5, planar_ring_5), dtype = int64, pad = -1, index(of = atoms, scope = padded_global))]
    planar_ring_5_index: Option<Tensor>,
    #[featshard(axes(6, planar_ring_6), dtype = int64, pad = -1, index(of = atoms, scope = padded_global))]
    planar_ring_6_index: Option<Tensor>,
    #[featshard(axes(2, connections), dtype = int64, pad = -1)]
    connected_chain_index: Option<Tensor>,
    #[featshard(axes(2, connections), dtype = int64, pad = -1, index(of = atoms, scope = padded_global))]
    connected_atom_index: Option<Tensor>,
    #[featshard(axes(2, chain_pairs), dtype = int64, pad = -1)]
    symmetric_chain_index: Option<Tensor>,
    #[featshard(axes(2, contacts), dtype = int64, pad = -1, index(of = atoms, scope = padded_global))]
    contact_pair_index: Option<Tensor>,
    #[featshard(axes(contacts), dtype = int64, pad = -1)]
    contact_union_index: Option<Tensor>,
    #[featshard(axes(contacts), dtype = bool)]
    contact_negation_mask: Option<Tensor>,
    #[featshard(axes(contacts), dtype = float32)]
    contact_thresholds: Option<Tensor>,
}

// Each derive emits its spec's table module, so a second struct of the same spec lives
// in a module of its own.
mod from_yaml {
    use super::*;

    /// The same struct, checked against the YAML instead of restating it.
    #[derive(Features)]
    #[featshard(spec = "examples/boltz2.yaml", workflow = "inference")]
    #[allow(dead_code)]
    pub struct FromYaml {
        token_index: Tensor,
        residue_index: Tensor,
        asym_id: Tensor,
        entity_id: Tensor,
        sym_id: Tensor,
        mol_type: Tensor,
        res_type: Tensor,
        disto_center: Tensor,
        token_pad_mask: Tensor,
        token_resolved_mask: Tensor,
        token_disto_mask: Tensor,
        cyclic_period: Tensor,
        method_feature: Tensor,
        modified: Tensor,
        atom_counts_per_token: Option<Tensor>,
        deletion_mean: Tensor,
        profile: Tensor,
        token_bonds: Tensor,
        type_bonds: Tensor,
        token_pair_pad_mask: Option<Tensor>,
        contact_conditioning: Tensor,
        contact_threshold: Tensor,
        disto_target: Tensor,
        msa: Tensor,
        msa_paired: Tensor,
        deletion_value: Tensor,
        has_deletion: Tensor,
        msa_mask: Tensor,
        ref_pos: Tensor,
        ref_charge: Tensor,
        bfactor: Tensor,
        plddt: Tensor,
        atom_resolved_mask: Tensor,
        atom_pad_mask: Tensor,
        ref_element: Tensor,
        ref_atom_name_chars: Tensor,
        ref_space_uid: Tensor,
        ref_chirality: Tensor,
        atom_backbone_feat: Tensor,
        pair_mask: Option<Tensor>,
        atom_to_token: Tensor,
        token_to_rep_atom: Tensor,
        r_set_to_rep_atom: Tensor,
        coords: Tensor,
        frames_idx: Tensor,
        frame_resolved_mask: Tensor,
        disto_coords_ensemble: Tensor,
        template_restype: Tensor,
        template_frame_rot: Tensor,
        template_frame_t: Tensor,
        template_cb: Tensor,
        template_ca: Tensor,
        template_mask_cb: Tensor,
        template_mask_frame: Tensor,
        template_mask: Tensor,
        visibility_ids: Tensor,
        query_to_template: Tensor,
        #[featshard(dtype = float32, axes(tokens))]
        affinity_token_mask: Tensor,
        rdkit_bounds_index: Option<Tensor>,
        rdkit_bounds_bond_mask: Option<Tensor>,
        rdkit_bounds_angle_mask: Option<Tensor>,
        rdkit_upper_bounds: Option<Tensor>,
        rdkit_lower_bounds: Option<Tensor>,
        chiral_atom_index: Option<Tensor>,
        chiral_reference_mask: Option<Tensor>,
        chiral_atom_orientations: Option<Tensor>,
        stereo_bond_index: Option<Tensor>,
        stereo_reference_mask: Option<Tensor>,
        stereo_bond_orientations: Option<Tensor>,
        planar_bond_index: Option<Tensor>,
        planar_ring_5_index: Option<Tensor>,
        planar_ring_6_index: Option<Tensor>,
        connected_chain_index: Option<Tensor>,
        connected_atom_index: Option<Tensor>,
        symmetric_chain_index: Option<Tensor>,
        contact_pair_index: Option<Tensor>,
        contact_union_index: Option<Tensor>,
        contact_negation_mask: Option<Tensor>,
        contact_thresholds: Option<Tensor>,
    }
}

/// The YAML's inference plan, less its metadata: a struct of tensors holds no
/// non-tensor values, so an attribute-only derive declares none.
fn yaml_plan() -> featshard::spec::Plan {
    yaml_plan_with(false)
}

fn yaml_plan_with(metadata: bool) -> featshard::spec::Plan {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/boltz2.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut spec = featshard::spec::parse_str("boltz2.yaml", &text).unwrap();
    if !metadata {
        spec.features
            .retain(|_, f| matches!(f.kind, featshard::spec::ir::FeatureKind::Tensor(_)));
    }
    let spec = spec.for_workflow("inference").unwrap();
    featshard::spec::plan::plan(&spec).unwrap()
}

fn without_source(mut p: featshard::spec::Plan) -> featshard::spec::Plan {
    p.source = featshard::spec::ir::Source {
        name: String::new(),
        sha256: String::new(),
    };
    p
}

mod one_axis {
    use super::*;

    /// A one-axis CP mesh in the derive: `mesh(cp, ...)`, MSA rows kept whole.
    #[derive(Features)]
    #[featshard(module = "one_axis_demo", mesh(cp, dp = dp))]
    #[featshard(semantic(tokens, shard), semantic(msa, shard, on_1d = whole))]
    #[allow(dead_code)]
    pub struct OneAxis {
        #[featshard(axes(tokens, tokens, 4), dtype = float32)]
        pair: Tensor,
        #[featshard(axes(msa, tokens), dtype = int64)]
        msa: Tensor,
    }
}

#[test]
fn a_one_axis_mesh_in_the_derive_places_as_the_yaml_does() {
    use featshard::spec::Placement;
    let plan = one_axis::OneAxis::plan();
    assert_eq!(plan.mesh.axes(), ["cp"]);
    assert_eq!(
        plan.tensor("pair").unwrap().placements,
        [Placement::Shard(0)]
    );
    assert_eq!(
        plan.tensor("msa").unwrap().placements,
        [Placement::Shard(1)]
    );
    let yaml = "version: 1\nmodule: one_axis_demo\nmesh: {cp: [cp], dp: dp}\nsemantics:\n  tokens: {shard: true}\n  msa: {shard: true, on_1d: whole}\nfeatures:\n  pair: {axes: [tokens, tokens, 4], dtype: float32}\n  msa: {axes: [msa, tokens], dtype: int64}\n";
    let (_, from_yaml) = featshard::spec::compile_str("one_axis.yaml", yaml).unwrap();
    assert_eq!(without_source(plan.clone()), without_source(from_yaml));
}

#[test]
fn field_attributes_give_the_plan_of_the_yaml() {
    assert_eq!(
        without_source(Boltz2Inference::plan().clone()),
        without_source(yaml_plan())
    );
}

#[test]
fn field_attributes_give_the_same_generated_rust_tables() {
    let ours =
        featshard::codegen::rust_module(&without_source(Boltz2Inference::plan().clone())).unwrap();
    let yaml = featshard::codegen::rust_module(&without_source(yaml_plan())).unwrap();
    assert_eq!(ours, yaml);
}

#[test]
fn the_spec_file_mode_plans_the_yaml_itself() {
    assert_eq!(
        without_source(from_yaml::FromYaml::plan().clone()),
        without_source(yaml_plan_with(true))
    );
    assert_eq!(from_yaml::FromYaml::WORKFLOW, Some("inference"));
}

#[test]
fn associated_consts_hold_the_tables() {
    use boltz2_placements::{Placement, Semantic};
    let find = |name: &str| {
        Boltz2Inference::PLACEMENTS
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap()
            .1
    };
    assert_eq!(
        find("token_pair_pad_mask"),
        &[Placement::Shard(0), Placement::Shard(1)]
    );
    assert_eq!(find("coords"), &[Placement::Shard(1), Placement::Replicate]);
    let (_, axes) = Boltz2Inference::AXIS_SEMANTICS
        .iter()
        .find(|(n, _)| *n == "atom_to_token")
        .unwrap();
    assert_eq!(*axes, &[Some(Semantic::Atoms), Some(Semantic::Tokens)]);
    assert_eq!(Boltz2Inference::PLACEMENTS.len(), 79);
}

/// A Boltz-shaped sample: one token per entry of `atoms` (its atom count), `msa` MSA
/// rows and `rset` R-set rows.
fn boltz_shape(atoms: Vec<usize>, msa: usize, rset: usize) -> Shape {
    Shape::boltz(atoms, msa, Some(rset))
}

#[test]
fn a_runtime_round_trip_through_the_derived_methods_on_3x3() {
    let shape = boltz_shape(vec![3, 0, 2, 5, 1, 0, 0, 4, 2, 1, 6, 0, 2], 4, 5);
    let sample = synthetic::sample(Boltz2Inference::plan(), None, &shape, 3).unwrap();
    let serial = Boltz2Inference::from_features(sample).unwrap();
    let padded = serial.pad(cp_mesh(&[3, 3])).unwrap();
    let locals: Vec<Boltz2InferenceLocal> = (0..9)
        .map(|r| Boltz2Inference::local(&padded, r).unwrap())
        .collect();
    // Typed access to a rank's block.
    assert_eq!(locals[4].token_pair_pad_mask.size(), vec![5, 5]);
    // The pipeline made the derived pair mask: the serial struct had none.
    assert!(serial.token_pair_pad_mask.is_none());
    let back = Boltz2Inference::assemble(&padded.layout, &locals).unwrap();
    for (name, x) in serial.to_features() {
        assert!(
            back.to_features()[&name].equal(&x),
            "{name} differs after the round trip"
        );
    }
    let _: &Tensor = &back.ref_pos;
}

#[test]
fn the_derived_distribute_hands_each_rank_its_typed_blocks_over_gloo() {
    use featshard::runtime::dist::{BufferPool, GroupOptions, Mesh, Rendezvous};
    let shape = boltz_shape(vec![2, 0, 3, 1, 4, 0, 2, 2, 1, 0, 5], 3, 4);
    let opts = GroupOptions {
        timeout: std::time::Duration::from_secs(30),
        ..GroupOptions::default()
    };
    // torch's generator is process-global: draw the sample once, before the threads.
    let sample = synthetic::sample(Boltz2Inference::plan(), None, &shape, 5).unwrap();
    let handles: Vec<_> = Rendezvous::in_process(4, opts)
        .unwrap()
        .into_iter()
        .map(|rdv| {
            let copy = sample
                .iter()
                .map(|(k, v)| (k.clone(), v.shallow_clone()))
                .collect();
            std::thread::spawn(move || {
                let shape = featshard::spec::DeviceMesh::new(1, cp_mesh(&[2, 2])).unwrap();
                let mesh = Mesh::new(&rdv, shape).unwrap();
                // Every rank holds the serial sample, to compare; only the source sends it.
                let serial = Boltz2Inference::from_features(copy).unwrap();
                let want =
                    Boltz2Inference::local(&serial.pad(cp_mesh(&[2, 2])).unwrap(), mesh.cp_rank())
                        .unwrap();
                // Without a pool, then twice through one: the second step reuses the
                // first one's buffers, dropped by then.
                let pool = BufferPool::new(if mesh.is_source() { 5 } else { 1 });
                let pooled = Boltz2Inference::distributor(&mesh)
                    .send_pool(pool.clone())
                    .recv_pool(pool);
                let mut received = None;
                for step in 0..3 {
                    // The previous sample is dropped before this step.
                    let prev = received.take().map(|(at, _)| at);
                    let source = mesh.is_source().then_some((7 + step, &serial));
                    let got = if step == 0 {
                        Boltz2Inference::distribute(&mesh, source)
                    } else {
                        Boltz2Inference::distribute_with(&pooled, source)
                    }
                    .unwrap();
                    assert_eq!(got.sample, 7 + step);
                    assert_eq!(got.meta.len(), 79);
                    assert_eq!(
                        got.meta["token_pair_pad_mask"].global_shape,
                        vec![12, 12],
                        "tokens padded to a multiple of 2"
                    );
                    let (g, w) = (got.local.to_features(), want.to_features());
                    assert_eq!(g.keys().collect::<Vec<_>>(), w.keys().collect::<Vec<_>>());
                    for (name, x) in &w {
                        assert!(
                            g[name].equal(x),
                            "rank {}, step {step}: {name}",
                            mesh.rank()
                        );
                    }
                    // A plain block is a view of the receive buffer, and a mask's (sent
                    // compact) is expanded into the same pooled buffer's tail.
                    let at = (g["ref_pos"].data_ptr(), g["token_pair_pad_mask"].data_ptr());
                    if step == 2 {
                        let rank = mesh.rank();
                        assert_eq!(Some(at), prev, "rank {rank}: the receive buffer is reused");
                    }
                    received = Some((at, got));
                }
                let got = received.unwrap().1;
                (got.layout, got.local)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let layout = results[0].0.clone();
    let locals: Vec<Boltz2InferenceLocal> = results.into_iter().map(|(_, l)| l).collect();
    let back = Boltz2Inference::assemble(&layout, &locals).unwrap();
    for (name, x) in &sample {
        assert!(
            back.to_features()[name].equal(x),
            "{name} after distribute + assemble"
        );
    }
}

fn cp_mesh(sizes: &[usize]) -> featshard::spec::Mesh {
    featshard::spec::Mesh::new(sizes).unwrap()
}
