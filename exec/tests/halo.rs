//! A key halo (`derive: {halo: {of, size}}`) over windowed atoms (`layout: windows`): beside
//! each rank's block of the feature, the `size` atoms before the block and the `size`
//! after it in the serial order, pads past either end, on 2-D tiles and on one axis;
//! its DTensor is Shard over the same mesh axis as the feature's.

use featshard_exec::array::Array;
use featshard_exec::blocks::{feature_blocks, Part};
use featshard_exec::files::Sample;
use featshard_exec::{place, Options};
use featshard_spec::ir::DType;
use featshard_spec::plan::Plan;
use featshard_spec::Mesh;

const HALO: usize = 3;

fn spec(mesh: &str, halo: &str) -> String {
    format!(
        "version: 1
module: t
mesh: {{cp: {mesh}}}
semantics:
  tokens: {{shard: true}}
  atoms: {{shard: true, owner: tokens, counts: atoms_per_token, window: 4, layout: windows}}
features:
  atoms_per_token: {{axes: [tokens], dtype: int64}}
  ref_pos: {{axes: [atoms, 3], dtype: float32}}
  ref_pos_keys: {{axes: [atoms, 3], dtype: float32, pad: -1.0, derive: {{halo: {halo}}}}}
"
    )
}

fn plan(mesh: &str) -> Plan {
    let text = spec(mesh, &format!("{{of: ref_pos, size: {HALO}}}"));
    featshard_spec::compile_str("t.yaml", &text)
        .unwrap_or_else(|d| panic!("{}", d.render_plain()))
        .1
}

/// Tokens of 2, 0, 3, 1, 2, 5, 1 atoms; atom `a`'s reference position is `a + 0.25` on
/// every axis.
fn sample() -> Sample<'static> {
    let counts = [2i64, 0, 3, 1, 2, 5, 1];
    let atoms: i64 = counts.iter().sum();
    let mut s = Sample::new();
    s.insert(
        "atoms_per_token".into(),
        Array::owned(
            DType::Int64,
            vec![counts.len()],
            counts.iter().flat_map(|c| c.to_le_bytes()).collect(),
        ),
    );
    let pos: Vec<u8> = (0..atoms)
        .flat_map(|a| [a as f32 + 0.25; 3])
        .flat_map(f32::to_le_bytes)
        .collect();
    s.insert(
        "ref_pos".into(),
        Array::owned(DType::Float32, vec![atoms as usize, 3], pos),
    );
    s
}

fn rows(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(12)
        .map(|r| f32::from_le_bytes(r[..4].try_into().unwrap()))
        .collect()
}

#[test]
fn each_rank_gets_the_atoms_around_its_block_beside_it() {
    let atoms = 14i64;
    for (axes, meshes) in [
        (
            "[cp0, cp1]",
            vec![vec![2, 2], vec![3, 3], vec![2, 3], vec![1, 1]],
        ),
        ("[cp]", vec![vec![1], vec![2], vec![3], vec![4], vec![8]]),
    ] {
        let plan = plan(axes);
        for sizes in meshes {
            let mesh = Mesh::new(&sizes).unwrap();
            let placed = place(&plan, mesh, &sample(), &Options::default()).expect("place");
            let blocks = feature_blocks(&plan, &placed).expect("blocks");
            let block = |name: &str, rank: usize| {
                let f = blocks.iter().find(|f| f.name == name).unwrap();
                let part = Part::Block(mesh.coord(rank));
                let mut bytes = Vec::new();
                f.write_part(&placed, part, &mut bytes).unwrap();
                (f.shape_of(&placed, part), bytes)
            };
            let keys = plan.tensor("ref_pos_keys").unwrap();
            assert_eq!(keys.placements, plan.tensor("ref_pos").unwrap().placements);
            for rank in 0..mesh.ranks() {
                let (shape, own) = block("ref_pos", rank);
                let (halo_shape, halo) = block("ref_pos_keys", rank);
                assert_eq!(halo_shape, vec![2 * HALO, 3], "{sizes:?} rank {rank}");
                // Atoms are split over the first mesh axis, in serial order.
                let (len, shards) = (shape[0] as i64, mesh.size(0) as i64);
                let start = mesh.coord(rank).get(0) as i64 * len;
                assert!(rows(&own)
                    .iter()
                    .zip(start..)
                    .all(|(&v, a)| a >= atoms || v == a as f32 + 0.25));
                let want: Vec<f32> = (start - HALO as i64..start)
                    .chain(start + len..start + len + HALO as i64)
                    .map(|p| match p {
                        p if p < 0 || p >= len * shards => -1.0, // past the axis: the halo's pad
                        p if p >= atoms => 0.0,                  // a pad atom: ref_pos's pad
                        p => p as f32 + 0.25,
                    })
                    .collect();
                assert_eq!(
                    rows(&halo),
                    want,
                    "{axes} {sizes:?} rank {rank}: block from {start}"
                );
            }
        }
    }
}

#[test]
fn the_halo_comes_back_with_the_sample_and_beside_it() {
    let plan = plan("[cp0, cp1]");
    let mesh = Mesh::new(&[3, 2]).unwrap();
    let s = sample();
    let placed = place(&plan, mesh, &s, &Options::default()).expect("place");
    let blocks = feature_blocks(&plan, &placed).expect("blocks");
    let ranks: Vec<Sample> = (0..mesh.ranks())
        .map(|r| {
            blocks
                .iter()
                .map(|f| {
                    let part = Part::Block(mesh.coord(r));
                    let mut bytes = Vec::new();
                    f.write_part(&placed, part, &mut bytes).unwrap();
                    (
                        f.name.clone(),
                        Array::owned(f.dtype, f.shape_of(&placed, part), bytes),
                    )
                })
                .collect()
        })
        .collect();
    let padded =
        featshard_exec::assemble::assemble(&plan, &placed.layout, None, &ranks).expect("assemble");
    // The halo's whole: one halo per shard of the atom axis, in shard order.
    assert_eq!(padded["ref_pos_keys"].shape, vec![3 * 2 * HALO, 3]);
    let serial = featshard_exec::assemble::unpad(&plan, &placed.layout, padded).expect("unpad");
    let direct = featshard_exec::assemble::assemble_serial(&plan, &placed.layout, None, &ranks)
        .expect("serial");
    assert_eq!(
        direct, serial,
        "the serial assembler differs from unpad of the padded"
    );
    assert_eq!(serial["ref_pos"].bytes, s["ref_pos"].base_bytes());
    // The halo is laid out only: the serial sample is the one given, which shards again.
    assert!(!serial.contains_key("ref_pos_keys"), "{:?}", serial.keys());
}

#[test]
fn a_halo_the_sample_gives_or_the_spec_cannot_make_is_refused_by_name() {
    let plan = plan("[cp]");
    let mut s = sample();
    s.insert("ref_pos_keys".into(), s["ref_pos"].clone());
    let e = place(&plan, Mesh::new(&[2]).unwrap(), &s, &Options::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`ref_pos_keys`")
            && e.contains("the halo of `ref_pos`")
            && e.contains("leave it out"),
        "{e}"
    );
    for (text, says) in [
        (
            spec("[cp]", "{of: ref_pos, size: 0}"),
            "a halo of 0 items a side",
        ),
        (
            spec("[cp]", "{of: atoms_per_token, size: 2}"),
            "has axes [tokens]",
        ),
        (
            spec("[cp]", "{of: ref_pos, size: 2}")
                .replace(", window: 4, layout: windows", ", window: 4"),
            "does not declare `layout: windows`",
        ),
        (
            spec("[cp]", "{of: ref_pos, size: 2}")
                .replace("dtype: float32, pad: -1.0", "dtype: float64, pad: -1.0"),
            "declare `dtype: float32`",
        ),
    ] {
        let e = match featshard_spec::compile_str("t.yaml", &text) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(d) => d.render_plain(),
        };
        assert!(
            e.contains("ref_pos_keys") && e.contains(says) && e.contains("t.yaml:10"),
            "{says}: {e}"
        );
    }
}
