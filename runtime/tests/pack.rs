//! The packed atom layout for windowed attention.

mod common;

use featshard_runtime::pack::pack;
use featshard_runtime::{pad, Options};
use featshard_spec::Placement;
use tch::{Kind, Tensor};

fn inference() -> Options {
    Options {
        workflow: Some("inference".into()),
        ..Options::default()
    }
}

fn check_packed(mesh: featshard_spec::Mesh) {
    let plan = common::boltz2_plan();
    let counts: Vec<i64> = vec![3, 0, 2, 5, 1, 0, 0, 4, 2, 1, 3, 7, 0, 1, 30, 2];
    let a: i64 = counts.iter().sum();
    let n = counts.len() as i64;
    let sample = common::boltz_sample(&plan, &counts, 5);
    let packed = pack(&plan, mesh, &sample, &inference(), "atoms").expect("pack");
    let w = 32 * mesh.size(0) as i64;
    let len = packed.packed_len as i64;
    assert!(
        len >= a && len % w == 0 && len - a < w,
        "packed length {len} for {a} atoms, W x cp0 = {w}"
    );

    // Atom features: real atoms first, in serial order, then pads.
    let ref_pos = &packed.tensors["ref_pos"];
    assert_eq!(ref_pos.size(), vec![len, 3]);
    assert!(ref_pos.narrow(0, 0, a).equal(&sample["ref_pos"]));
    assert_eq!(
        ref_pos
            .narrow(0, a, len - a)
            .abs()
            .sum(Kind::Float)
            .double_value(&[]),
        0.0
    );
    assert!(packed.tensors["coords"]
        .narrow(1, 0, a)
        .equal(&sample["coords"]));

    // atom_to_token: global token ids, -1 at pads; never a one-hot.
    let token_of_atom: Vec<i64> = counts
        .iter()
        .enumerate()
        .flat_map(|(t, &c)| std::iter::repeat_n(t as i64, c as usize))
        .collect();
    let ids = &packed.tensors["atom_to_token"];
    assert_eq!(ids.size(), vec![len]);
    assert!(ids
        .narrow(0, 0, a)
        .equal(&Tensor::from_slice(&token_of_atom)));
    assert!(ids.narrow(0, a, len - a).eq(-1).all().int64_value(&[]) == 1);

    // token_to_rep_atom: each token's first atom (packed id), -1 without atoms.
    let rep = &packed.tensors["token_to_rep_atom"];
    let mut first = 0;
    for (t, &c) in counts.iter().enumerate() {
        let want = if c > 0 { first } else { -1 };
        assert_eq!(rep.int64_value(&[t as i64]), want, "token {t}");
        first += c;
    }
    assert!(
        rep.narrow(0, n, rep.size()[0] - n)
            .eq(-1)
            .all()
            .int64_value(&[])
            == 1
    );

    // r_set_to_rep_atom: every real row names its representative atom.
    let serial_rep = sample["r_set_to_rep_atom"].argmax(1, false);
    let r_ids = &packed.tensors["r_set_to_rep_atom"];
    let r_pos = &packed.rest.layout.positions["rset"];
    for (row, &p) in r_pos.iter().enumerate() {
        assert_eq!(
            r_ids.int64_value(&[p as i64]),
            serial_rep.int64_value(&[row as i64])
        );
    }

    // frames_idx keeps serial atom ids: left-packed atoms have them as packed ids.
    assert!(packed.tensors["frames_idx"]
        .narrow(1, 0, n)
        .equal(&sample["frames_idx"]));

    // Blocks split the packed axis evenly over cp0, whole windows each.
    for rank in 0..mesh.ranks() {
        let coord = mesh.coord(rank);
        let b = packed.block(&plan, "ref_pos", coord).expect("block");
        assert_eq!(b.tensor.size(), vec![len / mesh.size(0) as i64, 3]);
        assert_eq!((len / mesh.size(0) as i64) % 32, 0);
        assert_eq!(
            b.meta.placements,
            vec![Placement::Shard(0), Placement::Replicate]
        );
        let pm = packed.block(&plan, "pair_mask", coord).expect("block");
        assert_eq!(pm.tensor.size(), vec![len / mesh.size(0) as i64, len]);
    }

    // Features without atoms are as in the plain padded layout.
    let plain = pad(&plan, mesh, &sample, &inference()).expect("pad");
    assert!(packed.rest.tensors["token_pair_pad_mask"].equal(&plain.tensors["token_pair_pad_mask"]));
    assert!(
        !packed.rest.tensors.contains_key("ref_pos"),
        "a packed feature was padded twice"
    );
}

#[test]
fn atoms_pack_left_and_split_in_whole_windows_on_3x3() {
    check_packed(common::mesh(&[3, 3]));
}

#[test]
fn atoms_pack_left_and_split_in_whole_windows_on_2x3() {
    check_packed(common::mesh(&[2, 3]));
}

#[test]
fn a_semantic_without_window_cannot_be_packed() {
    let plan = common::boltz2_plan();
    let sample = common::boltz_sample(&plan, &[1, 2], 5);
    let e = pack(
        &plan,
        common::mesh(&[1, 1]),
        &sample,
        &inference(),
        "tokens",
    )
    .expect_err("tokens has no window");
    assert!(e.to_string().contains("semantic `tokens` has no `window`"));
}
