//! Real Boltz-2 featurizer output (`tests/data/real`), unchanged, through the runtime:
//! intake drops the incoming pads, the sample pads, shards and assembles back, masks
//! are 0 exactly at pads and every remapped id points at the same item as before.

mod common;

use std::path::PathBuf;

use featshard_runtime::kind::kind_of;
use featshard_runtime::{assemble, intake, pad, place, unpad, Features, Options, Padded, Placed};
use featshard_spec::ir::Role;
use featshard_spec::plan::{Plan, Remap};
use tch::{Kind, Tensor};

const SAMPLES: [&str; 4] = [
    "prot60_nomsa",
    "prot60_smiles",
    "boltz_cp/prot60_nomsa",
    "boltz_cp/prot60_smiles",
];
const MESHES: [[usize; 2]; 4] = [[1, 1], [2, 2], [3, 3], [2, 3]];

fn real(name: &str) -> Features {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/real")
        .join(format!("{name}.safetensors"));
    Tensor::read_safetensors(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .collect()
}

fn inference() -> Options {
    Options {
        workflow: Some("inference".into()),
        ..Options::default()
    }
}

fn blocks(plan: &Plan, padded: &Padded) -> Vec<Features> {
    (0..padded.world_size())
        .map(|r| {
            padded
                .rank_blocks(plan, r)
                .unwrap()
                .into_iter()
                .map(|(n, b)| (n, b.tensor))
                .collect()
        })
        .collect()
}

#[test]
fn intake_drops_exactly_the_incoming_atom_pads_and_the_dropped_keys() {
    let plan = common::boltz2_plan();
    for name in SAMPLES {
        let sample = real(name);
        let taken = intake(&plan, &sample, &inference()).unwrap();
        let real_atoms = sample["atom_pad_mask"].sum(Kind::Int64).int64_value(&[]);
        assert_eq!(taken.features["ref_pos"].size()[0], real_atoms, "{name}");
        assert_eq!(
            taken.arrived["atoms"],
            sample["ref_pos"].size()[0] as usize,
            "{name}"
        );
        assert!(
            !taken.arrived.contains_key("tokens"),
            "{name}: tokens are not padded"
        );
        assert_eq!(taken.dropped, ["ensemble_ref_idxs", "token_to_center_atom"]);
        // Nothing is lost: every incoming pad holds only zeros (the features' pad value).
        for (f, x) in &sample {
            if let Some(t) = taken.features.get(f) {
                let kept = x.numel() as i64 - t.numel() as i64;
                let lost = x
                    .to_kind(Kind::Double)
                    .abs()
                    .sum(Kind::Double)
                    .double_value(&[])
                    - t.to_kind(Kind::Double)
                        .abs()
                        .sum(Kind::Double)
                        .double_value(&[]);
                assert!(
                    kept == 0 || lost == 0.0,
                    "{name} {f}: a cut pad held values"
                );
            }
        }
        // The pipeline made the pair mask: the outer product of the token mask.
        let m = &sample["token_pad_mask"];
        let pair = &taken.features["token_pair_pad_mask"];
        assert!(pair.equal(&(m.unsqueeze(1) * m.unsqueeze(0))), "{name}");
    }
}

#[test]
fn every_real_sample_shards_and_assembles_back_on_every_mesh() {
    let plan = common::boltz2_plan();
    for name in SAMPLES {
        let sample = real(name);
        let taken = intake(&plan, &sample, &inference()).unwrap();
        for mesh in MESHES.map(|s| common::mesh(&s)) {
            let padded = pad(&plan, mesh, &sample, &inference()).unwrap();
            let ranks = blocks(&plan, &padded);
            let global = assemble(&plan, &padded.layout, Some("inference"), &ranks).unwrap();
            for (f, x) in &padded.tensors {
                assert!(global[f].equal(x), "{name} {mesh:?} {f}: assembly differs");
            }
            let serial = unpad(&plan, &padded.layout, &global).unwrap();
            for (f, x) in &serial {
                assert!(
                    taken.features[f].equal(x),
                    "{name} {mesh:?} {f}: the round trip differs"
                );
            }
            if mesh.ranks() > 1 {
                let local = &ranks[0]["token_pair_pad_mask"];
                assert!(local.size()[0] < padded.tensors["token_pair_pad_mask"].size()[0]);
            }
        }
    }
}

#[test]
fn masks_are_zero_exactly_at_pads() {
    let plan = common::boltz2_plan();
    for name in SAMPLES {
        let sample = real(name);
        let padded = pad(&plan, common::mesh(&[3, 3]), &sample, &inference()).unwrap();
        let atoms = &padded.layout.positions["atoms"];
        let a_pad = padded.layout.padded["atoms"];
        let real_atom: Vec<bool> = (0..a_pad).map(|p| atoms.contains(&p)).collect();
        let mask: Vec<f64> =
            Vec::try_from(&padded.tensors["atom_pad_mask"].to_kind(Kind::Double)).unwrap();
        for (p, (&m, &r)) in mask.iter().zip(&real_atom).enumerate() {
            assert_eq!(m, if r { 1.0 } else { 0.0 }, "{name}: atom_pad_mask at {p}");
        }
        let n = padded.layout.sizes["tokens"] as i64;
        let pair = &padded.tensors["token_pair_pad_mask"];
        assert_eq!(
            pair.sum(Kind::Double).double_value(&[]),
            (n * n) as f64,
            "{name}"
        );
        assert_eq!(
            pair.narrow(0, 0, n)
                .narrow(1, 0, n)
                .sum(Kind::Double)
                .double_value(&[]),
            (n * n) as f64
        );
    }
}

/// Every padded-global index (frames, constraint lists) and every atom -> token entry
/// points at the same atom or token after padding as before: the atom at the new
/// position has the same reference position and the same token.
#[test]
fn every_remapped_id_points_at_the_same_item() {
    let plan = common::boltz2_plan();
    for name in SAMPLES {
        let sample = real(name);
        let taken = intake(&plan, &sample, &inference()).unwrap().features;
        for mesh in MESHES.map(|s| common::mesh(&s)) {
            let padded = pad(&plan, mesh, &sample, &inference()).unwrap();
            let ref_pos = &padded.tensors["ref_pos"];
            let mut checked = 0;
            for (f, t) in plan.tensors() {
                let Remap::ToPaddedLayout { of, .. } = &t.remap else {
                    continue;
                };
                let (Some(serial), Some(moved)) = (taken.get(f), padded.tensors.get(f)) else {
                    continue;
                };
                assert_eq!(of, "atoms");
                let s = serial.flatten(0, -1);
                let n = s.size()[0];
                let m = moved.narrow_copy_like(serial).flatten(0, -1);
                assert!(
                    taken["ref_pos"]
                        .index_select(0, &s)
                        .equal(&ref_pos.index_select(0, &m)),
                    "{name} {mesh:?} {f}: a remapped id points at another atom"
                );
                checked += n;
            }
            assert!(checked > 0, "{name}: no ids were checked");
            // atom -> token: the padded one-hot keeps every atom on its token.
            let a2t = &padded.tensors["atom_to_token"];
            let pos = Tensor::from_slice(
                &padded.layout.positions["atoms"]
                    .iter()
                    .map(|&p| p as i64)
                    .collect::<Vec<_>>(),
            );
            let tokens = a2t.index_select(0, &pos).argmax(1, false);
            assert!(
                tokens.equal(&taken["atom_to_token"].argmax(1, false)),
                "{name} {mesh:?}"
            );
        }
    }
}

#[test]
fn index_roles_match_the_real_values() {
    // The roles the spec gives are the ones the values have: token_index is a token
    // position, residue_index is not (it restarts in every chain).
    let plan = common::boltz2_plan();
    let sample = real("prot60_smiles");
    let n = sample["token_index"].size()[0];
    assert!(sample["token_index"].equal(&Tensor::arange(n, (Kind::Int64, tch::Device::Cpu))));
    assert!(!sample["residue_index"].equal(&Tensor::arange(n, (Kind::Int64, tch::Device::Cpu))));
    let role = |f: &str| {
        plan.tensors()
            .find(|(n, _)| *n == f)
            .map(|(_, t)| t.role.clone())
    };
    assert!(matches!(role("token_index"), Some(Role::Index(_))));
    assert_eq!(role("residue_index"), Some(Role::Data));
}

#[test]
fn blocks_differ_per_rank_on_a_sharded_mesh() {
    let plan = common::boltz2_plan();
    let sample = real("prot60_smiles");
    let padded = pad(&plan, common::mesh(&[2, 2]), &sample, &inference()).unwrap();
    let ranks = blocks(&plan, &padded);
    let c = common::mesh(&[2, 2]).coord(3);
    assert_eq!(c.as_slice(), &[1, 1]);
    assert!(!ranks[0]["ref_pos"].equal(&ranks[3]["ref_pos"]));
}

trait NarrowLike {
    fn narrow_copy_like(&self, serial: &Tensor) -> Tensor;
}

impl NarrowLike for Tensor {
    /// The leading `serial`-shaped part of a padded tensor (lists are never padded;
    /// `frames_idx` is cut to its real tokens).
    fn narrow_copy_like(&self, serial: &Tensor) -> Tensor {
        let mut x = self.shallow_clone();
        for (d, &n) in serial.size().iter().enumerate() {
            x = x.narrow(d as i64, 0, n);
        }
        x.contiguous()
    }
}

/// The sample as the featurizer emits it when given `max_tokens` / `max_atoms`: every
/// token and atom axis padded at the end with zeros, and the R-set map with all-zero
/// rows for the padded tokens.
fn as_if_padded_to_max(plan: &Plan, sample: &Features, tokens: i64, atoms: i64) -> Features {
    let n = sample["token_pad_mask"].size()[0];
    let mut out = Features::new();
    for (name, x) in sample {
        let Some((_, t)) = plan.tensors().find(|(n, _)| n == name) else {
            out.insert(name.clone(), x.shallow_clone());
            continue;
        };
        let mut y = x.shallow_clone();
        for (d, a) in t.axes.iter().enumerate() {
            let extra = match a.semantic.as_deref() {
                Some("tokens") => tokens - y.size()[d],
                Some("atoms") => atoms - y.size()[d],
                // One more (all-zero) R-set row per padded token.
                Some("rset") => tokens - n,
                _ => continue,
            };
            let mut shape = y.size();
            shape[d] = extra;
            let pad = Tensor::zeros(shape.as_slice(), (y.kind(), y.device()));
            y = Tensor::cat(&[y, pad], d as i64);
        }
        out.insert(name.clone(), y);
    }
    out
}

#[test]
fn a_sample_padded_to_max_tokens_and_atoms_gives_the_same_blocks() {
    let plan = common::boltz2_plan();
    for name in ["prot60_smiles", "boltz_cp/prot60_smiles"] {
        let sample = real(name);
        let padded_in = as_if_padded_to_max(&plan, &sample, 80, 544);
        assert_eq!(padded_in["token_bonds"].size(), [80, 80, 1]);
        assert_eq!(padded_in["r_set_to_rep_atom"].size(), [67, 544]);
        let taken = intake(&plan, &padded_in, &inference()).unwrap();
        assert_eq!(taken.arrived["tokens"], 80, "{name}");
        assert_eq!(taken.arrived["atoms"], 544, "{name}");
        assert_eq!(taken.unowned["rset"], 7, "{name}");
        for mesh in [[2, 2], [2, 3]].map(|s| common::mesh(&s)) {
            let want = pad(&plan, mesh, &sample, &inference()).unwrap();
            let got = pad(&plan, mesh, &padded_in, &inference()).unwrap();
            assert_eq!(want.layout, got.layout, "{name} {mesh:?}");
            for (f, x) in &want.tensors {
                assert!(got.tensors[f].equal(x), "{name} {mesh:?} {f}");
            }
        }
    }
}

/// The one-hot features and maps a featurizer can skip expanding, by the plan: a
/// feature declared one-hot on its last axis, a map one-hot on its last.
fn given_as_indices(plan: &Plan) -> Vec<String> {
    plan.tensors()
        .filter(|(_, t)| {
            let last = t.axes.len() - 1;
            t.one_hot == Some(last)
                || matches!(&t.role, Role::Index(ix) if ix.one_hot == Some(last) && last == 1)
        })
        .map(|(n, _)| n.to_owned())
        .collect()
}

/// The tch runtime, an adapter over the executor's intake, takes one-hot features and
/// maps given as their indices (int32, -1 for no 1), sparse features as their elements,
/// masks as bool and ranged ids as uint8, to the same layout and blocks.
#[test]
fn one_hot_features_maps_and_sparse_features_given_compact_give_the_same_blocks() {
    let plan = common::boltz2_plan();
    for name in SAMPLES {
        let sample = real(name);
        let mut given = sample
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect::<Features>();
        for f in given_as_indices(&plan)
            .iter()
            .filter(|f| sample.contains_key(*f))
        {
            let x = &sample[f];
            let real = x.sum_dim_intlist(-1, false, Kind::Int64).eq(1);
            let idx = x.argmax(-1, false).where_self(&real, &Tensor::from(-1i64));
            given.insert(f.clone(), idx.to_kind(Kind::Int));
        }
        // Masks as bool, ranged ids as uint8 (their ranges fit).
        for (f, t) in plan.tensors().filter(|(f, _)| sample.contains_key(*f)) {
            let narrow = match (&t.role, t.range) {
                (Role::Mask { .. }, _) if t.derived.is_none() => Kind::Bool,
                (Role::Data, Some(_)) => Kind::Uint8,
                _ => continue,
            };
            given.insert(f.to_owned(), sample[f].to_kind(narrow));
        }
        // Sparse features as their nonzero elements (`NAME.indices`, `NAME.values`).
        for (f, _) in plan.tensors().filter(|(_, t)| t.sparse) {
            let x = given.remove(f).unwrap();
            let at = x.nonzero();
            let values = x.index(&at.unbind(1).into_iter().map(Some).collect::<Vec<_>>());
            given.insert(format!("{f}.indices"), at.transpose(0, 1).contiguous());
            given.insert(format!("{f}.values"), values);
        }
        for mesh in MESHES.map(|s| common::mesh(&s)) {
            same_compact_blocks(&plan, mesh, &sample, &given, name);
            let want = pad(&plan, mesh, &sample, &inference()).unwrap();
            let got = pad(&plan, mesh, &given, &inference()).unwrap();
            assert_eq!(want.layout, got.layout, "{name} {mesh:?}");
            for (w, g) in blocks(&plan, &want).iter().zip(blocks(&plan, &got)) {
                for (f, x) in w {
                    assert!(g[f].equal(x), "{name} {mesh:?} {f}");
                }
            }
        }
    }
}

/// `given` (maps as indices, sparse features as elements) places to the same compact
/// blocks as the dense `sample` on every rank, and what it gives compact is held by its
/// rows or elements: no dense tensor of it is made.
fn same_compact_blocks(
    plan: &Plan,
    mesh: featshard_spec::Mesh,
    sample: &Features,
    given: &Features,
    what: &str,
) {
    let (want, got) = (
        place(plan, mesh, sample, &inference()).unwrap(),
        place(plan, mesh, given, &inference()).unwrap(),
    );
    for name in [
        "atom_to_token",
        "token_to_rep_atom",
        "type_bonds",
        "token_bonds",
    ] {
        let held = &got.exec().arrays[name];
        assert!(
            held.is_rows_only() || held.entry_list().is_some(),
            "{what} {name}"
        );
    }
    assert_eq!(want.names(), got.names(), "{what}");
    let compact = |p: &Placed, name: &str, coord| {
        let slot = p.slot(plan, name, true).unwrap();
        slot.compact.as_ref()?;
        let dims: Vec<i64> = slot.shape.iter().map(|&d| d as i64).collect();
        let out = Tensor::zeros(dims.as_slice(), (kind_of(slot.dtype), tch::Device::Cpu));
        p.write_compact_block(plan, name, coord, &out).unwrap();
        Some(out)
    };
    for rank in 0..mesh.ranks() {
        for name in want.names() {
            let (a, b) = (
                compact(&want, &name, mesh.coord(rank)),
                compact(&got, &name, mesh.coord(rank)),
            );
            let same = match (&a, &b) {
                (Some(a), Some(b)) => a.equal(b),
                (None, None) => true,
                _ => false,
            };
            assert!(same, "{what} {mesh:?} rank {rank} {name}");
        }
    }
}
