//! The layout a windowed atom attention wants, declared in the spec (`layout: windows`,
//! maps `deliver: ids`) and executed by the tch runtime as by `shard` and Python:
//! atoms in serial order, padded at the end, split in whole windows; each map the id
//! of its item in the global padded layout, -1 at pads.

mod common;

use featshard_runtime::{assemble, pad, unpad, Options};
use featshard_spec::plan::Plan;
use featshard_spec::Placement;
use tch::{Kind, Tensor};

fn inference() -> Options {
    Options {
        workflow: Some("inference".into()),
        ..Options::default()
    }
}

/// examples/boltz2.yaml with windowed atoms, every one-hot map delivered as ids, and the
/// key halo of the reference positions.
fn windowed_plan() -> Plan {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/boltz2.yaml");
    let text = std::fs::read_to_string(path)
        .expect("examples/boltz2.yaml")
        .replacen(
            "    window: 32\n",
            "    window: 32\n    layout: windows\n",
            1,
        )
        .replace(
            "scope: shard_local, one_hot: 1}",
            "scope: shard_local, one_hot: 1, deliver: ids}",
        )
        + "  ref_pos_keys: {axes: [atoms, 3], dtype: float32, derive: {halo: {of: ref_pos, size: 48}}}\n";
    featshard_spec::compile_str("boltz2.yaml", &text)
        .unwrap_or_else(|d| panic!("{}", d.render_plain()))
        .1
}

fn ids(x: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(x.to_kind(Kind::Int64).flatten(0, -1)).expect("ids")
}

fn check_windows(sizes: &[usize]) {
    let mesh = common::mesh(sizes);
    let plan = windowed_plan();
    let counts: Vec<i64> = vec![3, 0, 2, 5, 1, 0, 0, 4, 2, 1, 3, 7, 0, 1, 30, 2];
    let a: i64 = counts.iter().sum();
    let sample = common::boltz_sample(&plan, &counts, 5);
    let padded = pad(&plan, mesh, &sample, &inference()).expect("pad");
    let cp0 = mesh.size(0) as i64;
    // Pair features split atoms over both axes: whole windows on each needs W x lcm.
    let gcd = |mut x: i64, mut y: i64| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    let cp1 = mesh.size(1) as i64;
    let w = 32 * (cp0 * cp1 / gcd(cp0, cp1));
    let ref_pos = &padded.tensors["ref_pos"];
    let len = ref_pos.size()[0];
    assert!(
        len >= a && len % w == 0 && len - a < w,
        "{len} atoms for {a}, W x lcm(cp0, cp1) = {w}"
    );

    // Atom features: the serial atoms first, in order, then pads.
    assert!(ref_pos.narrow(0, 0, a).equal(&sample["ref_pos"]));
    assert_eq!(
        ref_pos
            .narrow(0, a, len - a)
            .abs()
            .sum(Kind::Float)
            .double_value(&[]),
        0.0
    );

    // atom_to_token: each atom's token, in the tokens' padded layout; -1 at pads.
    // Tokens own and lie in serial order: a token's padded position is its own.
    let tokens: Vec<usize> = match padded.layout.positions.get("tokens") {
        Some(p) => p.clone(),
        None => (0..counts.len()).collect(),
    };
    let token_of_atom: Vec<i64> = counts
        .iter()
        .enumerate()
        .flat_map(|(t, &c)| std::iter::repeat_n(tokens[t] as i64, c as usize))
        .collect();
    let a2t = ids(&padded.tensors["atom_to_token"]);
    assert_eq!(a2t.len() as i64, len);
    assert_eq!(a2t[..a as usize], token_of_atom[..]);
    assert!(a2t[a as usize..].iter().all(|&v| v == -1));

    // token_to_rep_atom: each token's first atom (a global atom id), -1 without atoms.
    let rep = ids(&padded.tensors["token_to_rep_atom"]);
    let mut first = 0;
    for (t, &c) in counts.iter().enumerate() {
        assert_eq!(rep[tokens[t]], if c > 0 { first } else { -1 }, "token {t}");
        first += c;
    }

    // r_set_to_rep_atom: every real row names its representative atom.
    let serial_rep = ids(&sample["r_set_to_rep_atom"].argmax(1, false));
    let r_ids = ids(&padded.tensors["r_set_to_rep_atom"]);
    for (row, &p) in padded.layout.positions["rset"].iter().enumerate() {
        assert_eq!(r_ids[p], serial_rep[row], "rset row {row}");
    }

    // Blocks: whole windows of the atom axis over cp0, ids whole on every rank.
    for rank in 0..mesh.ranks() {
        let b = padded
            .block(&plan, "ref_pos", mesh.coord(rank))
            .expect("block");
        assert_eq!(b.tensor.size(), vec![len / cp0, 3]);
        assert_eq!(
            b.meta.placements,
            vec![Placement::Shard(0), Placement::Replicate]
        );
        let m = padded
            .block(&plan, "atom_to_token", mesh.coord(rank))
            .expect("block");
        assert_eq!(m.tensor.size(), vec![len / cp0]);
        assert_eq!(m.tensor.kind(), Kind::Int64);
    }

    // The key halo: the 48 atoms before each block and the 48 after it, pads past the ends.
    let (block, halo) = (len / cp0, 48);
    let outside = Tensor::zeros([halo, 3], (Kind::Float, tch::Device::Cpu));
    let whole = Tensor::cat(&[&outside, ref_pos, &outside], 0);
    for rank in 0..mesh.ranks() {
        let start = mesh.coord(rank).get(0) as i64 * block;
        let keys = padded
            .block(&plan, "ref_pos_keys", mesh.coord(rank))
            .expect("halo");
        let want = Tensor::cat(
            &[
                whole.narrow(0, start, halo),
                whole.narrow(0, start + block + halo, halo),
            ],
            0,
        );
        assert!(keys.tensor.equal(&want), "rank {rank}'s key halo");
        assert_eq!(
            keys.meta.placements,
            vec![Placement::Shard(0), Placement::Replicate]
        );
    }

    // And back: every rank's blocks give the sample, the maps one-hot again.
    let blocks: Vec<featshard_runtime::Features> = (0..mesh.ranks())
        .map(|r| {
            let b = padded.rank_blocks(&plan, r).expect("blocks");
            b.into_iter().map(|(n, x)| (n, x.tensor)).collect()
        })
        .collect();
    let global = assemble(&plan, &padded.layout, Some("inference"), &blocks).expect("assemble");
    let serial = unpad(&plan, &padded.layout, &global).expect("unpad");
    for name in [
        "atom_to_token",
        "token_to_rep_atom",
        "r_set_to_rep_atom",
        "ref_pos",
    ] {
        assert!(serial[name].equal(&sample[name]), "{name} on {sizes:?}");
    }
}

#[test]
fn windowed_atoms_and_maps_as_ids_on_3x3() {
    check_windows(&[3, 3]);
}

#[test]
fn windowed_atoms_and_maps_as_ids_on_2x3() {
    check_windows(&[2, 3]);
}
