//! Parity: pad -> per-rank blocks -> assemble -> unpad equals the serial sample, on
//! random meshes, lengths and atom counts.

mod common;

use featshard_runtime::{assemble, intake, pad, place, unpad, Features, Options, Padded};
use featshard_spec::ir::Role;
use featshard_spec::plan::Split;
use featshard_spec::plan::{FeaturePlan, Plan};
use proptest::prelude::*;
use tch::Tensor;

fn inference() -> Options {
    Options {
        workflow: Some("inference".into()),
        ..Options::default()
    }
}

fn all_blocks(plan: &Plan, padded: &Padded) -> Vec<Features> {
    (0..padded.world_size())
        .map(|r| {
            padded
                .rank_blocks(plan, r)
                .expect("blocks")
                .into_iter()
                .map(|(n, b)| (n, b.tensor))
                .collect()
        })
        .collect()
}

fn assert_same(a: &Features, b: &Features, what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, x) in a {
        let y = &b[name];
        prop_assert_eq!(x.size(), y.size(), "{} {}: shape", what, name);
        prop_assert!(x.equal(y), "{} {}: values differ", what, name);
    }
    Ok(())
}

/// Atom counts with zero-atom tokens, a run of empty tokens (a shard with no atoms)
/// and sometimes one giant token.
fn counts_strategy() -> impl Strategy<Value = Vec<i64>> {
    (
        1usize..24,
        prop::collection::vec(0i64..5, 24),
        0usize..24,
        0usize..8,
        any::<bool>(),
    )
        .prop_map(|(n, c, empty_from, empty_len, giant)| {
            let mut counts: Vec<i64> = c[..n].to_vec();
            let empty = empty_from.min(n)..(empty_from + empty_len).min(n);
            counts[empty].fill(0);
            if giant {
                counts[n / 2] = 40;
            }
            if counts.iter().all(|&x| x == 0) {
                counts[n - 1] = 1;
            }
            counts
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn shard_then_assemble_then_unpad_is_the_serial_sample(
        mesh in (1usize..=4, 1usize..=4),
        counts in counts_strategy(),
        seed in 0i64..1000,
    ) {
        let plan = common::boltz2_plan();
        let mesh = common::mesh(&[mesh.0, mesh.1]);
        let sample = common::boltz_sample(&plan, &counts, seed);
        let padded = pad(&plan, mesh, &sample, &inference())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let ranks = all_blocks(&plan, &padded);
        // The sample the plan lays out: with its derived features made.
        let taken = intake(&plan, &sample, &inference())
            .map_err(|e| TestCaseError::fail(e.to_string()))?
            .features;

        for (name, shapes) in &padded.shapes {
            let FeaturePlan::Tensor(t) = &plan.features[name] else { continue };
            for blocks in &ranks {
                // Every rank's block has the planned local shape.
                let got: Vec<usize> = blocks[name].size().iter().map(|&d| d as usize).collect();
                prop_assert_eq!(&got, &shapes.local_shape, "{}", name);
            }
            for (d, a) in t.axes.iter().enumerate() {
                if let Split::Mesh { mesh_axis } = a.split {
                    if mesh.size(mesh_axis) > 1 && shapes.global_shape[d] > 0 {
                        // Sharding is active on every split axis of a mesh axis > 1.
                        prop_assert!(shapes.local_shape[d] < shapes.global_shape[d], "{} axis {}", name, d);
                    }
                }
            }
            if mesh.ranks() == 1 {
                prop_assert_eq!(&shapes.local_shape, &shapes.global_shape);
            }
            // Masks are zero at pads: nothing valid is added by padding.
            if let Role::Mask { .. } = t.role {
                let nonzero = |x: &Tensor| x.ne(0).sum(tch::Kind::Int64).int64_value(&[]);
                prop_assert_eq!(nonzero(&padded.tensors[name]), nonzero(&taken[name]), "{}", name);
            }
        }

        let assembled = assemble(&plan, &padded.layout, Some("inference"), &ranks)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        assert_same(&assembled, &padded.tensors, "assembled")?;
        let serial = unpad(&plan, &padded.layout, &assembled)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        assert_same(&serial, &taken, "unpadded")?;

        // Blocks written straight from the placed sample (as a source fills its send
        // buffers) are the same blocks, with the same metadata.
        let placed = place(&plan, mesh, &sample, &inference())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut written = Vec::new();
        for (r, blocks) in ranks.iter().enumerate() {
            let coord = mesh.coord(r);
            let mut mine = Features::new();
            for (name, view) in blocks {
                // Anything left unwritten would show as 7.
                let mut out = view.full_like(7);
                let meta = placed
                    .write_block(&plan, name, coord, &mut out)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(&meta, &padded.block(&plan, name, coord).expect("block").meta);
                mine.insert(name.clone(), out);
            }
            assert_same(&mine, blocks, "written block")?;
            written.push(mine);
        }
        let from_written = assemble(&plan, placed.layout(), Some("inference"), &written)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let serial = unpad(&plan, placed.layout(), &from_written)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        assert_same(&serial, &taken, "unpadded from written blocks")?;
    }
}

/// Meaning of the index features on a mesh: maps and indices still point at the same
/// items as in the serial sample.
fn check_index_meaning(mesh: featshard_spec::Mesh) {
    let plan = common::boltz2_plan();
    let counts: Vec<i64> = vec![3, 0, 2, 5, 1, 0, 0, 4, 2, 1, 3, 7, 0, 1];
    let sample = common::boltz_sample(&plan, &counts, 7);
    let padded = pad(&plan, mesh, &sample, &inference()).expect("pad");
    let layout = &padded.layout;
    let atom_pos = &layout.positions["atoms"];
    let n_loc = (layout.padded["tokens"] / mesh.size(0)) as i64;
    let a_loc = (layout.padded["atoms"] / mesh.size(0)) as i64;
    // Serial owner of every padded atom position.
    let token_of_atom: Vec<i64> = counts
        .iter()
        .enumerate()
        .flat_map(|(t, &c)| std::iter::repeat_n(t as i64, c as usize))
        .collect();
    let mut owner_at = vec![-1i64; layout.padded["atoms"]];
    for (atom, &p) in atom_pos.iter().enumerate() {
        owner_at[p] = token_of_atom[atom];
    }
    for rank in 0..mesh.ranks() {
        let i = mesh.coord(rank).get(0);
        let blocks = padded.rank_blocks(&plan, rank).expect("blocks");
        // atom_to_token: argmax per row + block offset is the serial owner.
        let a2t = &blocks["atom_to_token"].tensor;
        for row in 0..a2t.size()[0] {
            let r = a2t.get(row);
            let global_atom = i as i64 * a_loc + row;
            let owner = owner_at[global_atom as usize];
            if r.sum(tch::Kind::Int64).int64_value(&[]) == 0 {
                assert_eq!(
                    owner, -1,
                    "real atom {global_atom} lost its token on rank {rank}"
                );
                continue;
            }
            let local = r.argmax(0, false).int64_value(&[]);
            assert!(local < n_loc, "column ids are shard-local");
            assert_eq!(
                i as i64 * n_loc + local,
                owner,
                "rank {rank} atom row {row}"
            );
        }
        // r_set_to_rep_atom: every real row ends on the shard owning its token.
        let r2a = &blocks["r_set_to_rep_atom"].tensor;
        for row in 0..r2a.size()[0] {
            let r = r2a.get(row);
            if r.sum(tch::Kind::Int64).int64_value(&[]) == 0 {
                continue;
            }
            let atom = i as i64 * a_loc + r.argmax(0, false).int64_value(&[]);
            let token = owner_at[atom as usize];
            assert!(token >= 0, "R row points at a pad atom");
            assert_eq!(
                token / n_loc,
                i as i64,
                "R row on rank {rank} belongs to another shard"
            );
        }
    }
    // frames_idx points at the same atoms as serially (ref_pos is per atom).
    let frames = &padded.tensors["frames_idx"];
    let serial_frames = &sample["frames_idx"];
    let ref_pos = &padded.tensors["ref_pos"];
    let serial_ref = &sample["ref_pos"];
    let n = counts.len() as i64;
    let padded_coords = ref_pos
        .index_select(0, &frames.narrow(1, 0, n).flatten(0, -1))
        .view([2, n, 3, 3]);
    let serial_coords = serial_ref
        .index_select(0, &serial_frames.flatten(0, -1))
        .view([2, n, 3, 3]);
    assert!(
        padded_coords.equal(&serial_coords),
        "frames_idx points at other atoms"
    );
}

#[test]
fn index_features_keep_their_meaning_on_3x3() {
    check_index_meaning(common::mesh(&[3, 3]));
}

#[test]
fn index_features_keep_their_meaning_on_2x3() {
    check_index_meaning(common::mesh(&[2, 3]));
}

#[test]
fn dtensor_metadata_matches_the_plan() {
    let plan = common::boltz2_plan();
    let sample = common::boltz_sample(&plan, &[2, 1, 3, 0, 2], 1);
    let padded = pad(&plan, common::mesh(&[2, 3]), &sample, &inference()).expect("pad");
    let b = padded
        .block(
            &plan,
            "token_pair_pad_mask",
            common::coord(padded.mesh(), &[1, 2]),
        )
        .expect("block");
    assert_eq!(
        b.meta.placements,
        vec![
            featshard_spec::Placement::Shard(0),
            featshard_spec::Placement::Shard(1)
        ]
    );
    assert_eq!(b.meta.global_shape, vec![6, 6]);
    assert_eq!(b.meta.stride, vec![6, 1]);
    assert_eq!(b.tensor.size(), vec![3, 2]);
    let b = padded
        .block(
            &plan,
            "atom_to_token",
            common::coord(padded.mesh(), &[1, 0]),
        )
        .expect("block");
    assert_eq!(
        b.meta.global_shape[1], 3,
        "co-sharded axis counts one block"
    );
}

#[test]
fn a_block_on_a_leading_axis_is_a_view_of_the_padded_tensor() {
    let plan = common::boltz2_plan();
    let sample = common::boltz_sample(&plan, &[2, 1, 3, 0, 2, 1], 1);
    let padded = pad(&plan, common::mesh(&[3, 3]), &sample, &inference()).expect("pad");
    let b = padded
        .block(&plan, "ref_pos", common::coord(padded.mesh(), &[1, 0]))
        .expect("block");
    let base = padded.tensors["ref_pos"].data_ptr() as usize;
    let ptr = b.tensor.data_ptr() as usize;
    assert!(
        ptr > base,
        "block of rank 1 must alias the padded tensor, not copy it"
    );
}

#[test]
fn a_shard_without_atoms_and_a_giant_token_round_trip_on_3x3() {
    let plan = common::boltz2_plan();
    // Tokens 0..3 (the whole first shard on 3x3) own no atom; token 7 owns 60.
    let counts: Vec<i64> = vec![0, 0, 0, 2, 1, 3, 1, 60, 2];
    let sample = common::boltz_sample(&plan, &counts, 9);
    let padded = pad(&plan, common::mesh(&[3, 3]), &sample, &inference()).expect("pad");
    let blocks = &padded.layout.blocks["atoms"];
    assert_eq!(blocks.block_counts, vec![0, 6, 63]);
    assert_eq!(blocks.per_block, 63);
    let ranks = all_blocks(&plan, &padded);
    // Rank 0's atoms are all pads, still a full-size block.
    assert_eq!(ranks[0]["ref_pos"].size(), vec![63, 3]);
    assert_eq!(
        ranks[0]["atom_pad_mask"]
            .sum(tch::Kind::Float)
            .double_value(&[]),
        0.0
    );
    let short = assemble(&plan, &padded.layout, Some("inference"), &ranks[1..]).unwrap_err();
    assert_eq!(
        short.to_string(),
        "8 ranks' blocks given for mesh 3x3 (cp_axis_0, cp_axis_1) of 9 ranks"
    );
    let assembled = assemble(&plan, &padded.layout, Some("inference"), &ranks).expect("assemble");
    let serial = unpad(&plan, &padded.layout, &assembled).expect("unpad");
    for (name, x) in &sample {
        assert!(serial[name].equal(x), "{name}");
    }
}

/// A feature whose memory holds other values than it reads as: torch's negative bit
/// (what `_neg_view` and `.conj().imag` of a complex tensor give), on its own or on a
/// strided view.
fn marked(x: &Tensor) -> Tensor {
    x.neg().internal_neg_view()
}

#[test]
fn a_tensor_marked_negative_gives_the_blocks_of_its_resolved_copy() {
    let plan = common::boltz2_plan();
    let sample = common::boltz_sample(&plan, &[3, 1, 2, 4, 1, 2, 3], 7);
    let mut lazy: Features = sample
        .iter()
        .map(|(n, x)| (n.clone(), x.shallow_clone()))
        .collect();
    for name in ["ref_pos", "profile"] {
        let x = &sample[name];
        assert!(marked(x).is_neg() && marked(x).equal(x));
        lazy.insert(name.to_owned(), marked(x));
    }
    // A non-contiguous one too: read through the copy path.
    let x = &sample["ref_charge"];
    lazy.insert("ref_charge".into(), marked(&x.unsqueeze(1)).squeeze_dim(1));
    for mesh in [[1, 1], [2, 2], [3, 2]].map(|s| common::mesh(&s)) {
        let want = pad(&plan, mesh, &sample, &inference()).expect("pad");
        let got = pad(&plan, mesh, &lazy, &inference()).expect("pad");
        for (a, b) in all_blocks(&plan, &want)
            .iter()
            .zip(&all_blocks(&plan, &got))
        {
            assert_same(a, b, "marked").expect("the same blocks");
        }
    }
}
