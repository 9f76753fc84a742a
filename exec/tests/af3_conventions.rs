//! The AlphaFold3 family's conventions declared in the spec. Index features with a
//! none value (`-1`: a token without a frame atom, an atom of no token): none stays
//! none through the remap, the shard-local shift, the pads and the way back; any other
//! value outside the items is refused by name. Validity masks the featurizer does not
//! emit (`derive: {valid: true}`): 1 on every real item, 0 on every pad.

use std::collections::BTreeMap;

use featshard_exec::array::Array;
use featshard_exec::blocks::{feature_blocks, Part};
use featshard_exec::files::Sample;
use featshard_exec::{assemble, place, Options};
use featshard_spec::ir::DType;
use featshard_spec::plan::Plan;
use featshard_spec::Mesh;

/// On a 2-D tile atoms sit in their token's block, so a token id can be local to the
/// shard; on one axis atoms are split in serial order, so it is global.
fn spec(mesh: &str) -> String {
    let owner_scope = if mesh.contains(',') {
        "shard_local"
    } else {
        "padded_global"
    };
    format!(
        "version: 1
module: t
mesh: {{cp: {mesh}}}
semantics:
  tokens: {{shard: true}}
  atoms: {{shard: true, owner: tokens, counts: atoms_per_token}}
features:
  atoms_per_token: {{axes: [tokens], dtype: int64}}
  frame_atom: {{axes: [tokens, 3], dtype: int64, pad: -1, index: {{of: atoms, scope: padded_global, none: -1}}}}
  atom_token: {{axes: [atoms], dtype: int32, pad: -1, index: {{of: tokens, scope: {owner_scope}, none: -1}}}}
"
    )
}

fn ints(dtype: DType, shape: Vec<usize>, values: &[i64]) -> Array<'static> {
    let bytes = values
        .iter()
        .flat_map(|&v| match dtype {
            DType::Int32 => (v as i32).to_le_bytes().to_vec(),
            _ => v.to_le_bytes().to_vec(),
        })
        .collect();
    Array::owned(dtype, shape, bytes)
}

/// Tokens of 2, 0, 3, 1, 2 atoms; token 1 (no atoms) and token 4 have no frame.
fn sample(frame_atom: &[i64], atom_token: &[i64]) -> Sample<'static> {
    let counts = [2i64, 0, 3, 1, 2];
    let mut s = Sample::new();
    s.insert(
        "atoms_per_token".into(),
        ints(DType::Int64, vec![5], &counts),
    );
    s.insert(
        "frame_atom".into(),
        ints(DType::Int64, vec![5, 3], frame_atom),
    );
    s.insert("atom_token".into(), ints(DType::Int32, vec![8], atom_token));
    s
}

const FRAMES: [i64; 15] = [0, 1, 2, -1, -1, -1, 2, 3, 4, 5, 4, 3, -1, -1, -1];
// The last two atoms (token 4's) belong to no token as the featurizer wrote them.
const OWNERS: [i64; 8] = [0, 0, 2, 2, 2, 3, -1, -1];

fn values(a: &featshard_exec::assemble::Dense) -> Vec<i64> {
    let x = Array::owned(a.dtype, a.shape.clone(), a.bytes.clone());
    x.values().into_iter().map(|v| v as i64).collect()
}

/// Every rank's blocks, as the rank files hold them (dense).
fn rank_blocks(plan: &Plan, placed: &featshard_exec::Placed, mesh: Mesh) -> Vec<Sample<'static>> {
    let all = feature_blocks(plan, placed).expect("blocks");
    (0..mesh.ranks())
        .map(|rank| {
            let coord = mesh.coord(rank);
            all.iter()
                .filter(|f| f.is_placed())
                .map(|f| {
                    let shape = f.shape_of(placed, Part::Block(coord));
                    let mut bytes = Vec::new();
                    f.write_part(placed, Part::Block(coord), &mut bytes)
                        .unwrap();
                    (f.name.clone(), Array::owned(f.dtype, shape, bytes))
                })
                .collect()
        })
        .collect()
}

fn shard_and_assemble(plan: &Plan, mesh: Mesh, s: &Sample) -> BTreeMap<String, Vec<i64>> {
    let placed = place(plan, mesh, s, &Options::default()).expect("place");
    let ranks = rank_blocks(plan, &placed, mesh);
    // Every none in a block is still none; every other id is an item's.
    for ids in ranks.iter().filter_map(|blocks| blocks.get("atom_token")) {
        let ids = ids.values();
        assert!(ids.iter().all(|&v| v >= -1.0), "{ids:?}");
    }
    let padded = assemble::assemble(plan, &placed.layout, None, &ranks).expect("assemble");
    let serial = assemble::unpad(plan, &placed.layout, padded).expect("unpad");
    let direct = assemble::assemble_serial(plan, &placed.layout, None, &ranks).expect("serial");
    assert_eq!(
        direct, serial,
        "the serial assembler differs from unpad of the padded"
    );
    serial.iter().map(|(n, d)| (n.clone(), values(d))).collect()
}

#[test]
fn none_stays_none_through_every_remap_and_pad_and_back() {
    let s = sample(&FRAMES, &OWNERS);
    for (axes, meshes) in [
        ("[cp0, cp1]", vec![vec![3, 3], vec![2, 1], vec![1, 2]]),
        ("[cp]", vec![vec![4], vec![3]]),
    ] {
        let plan = featshard_spec::compile_str("t.yaml", &spec(axes))
            .expect("spec")
            .1;
        for sizes in meshes {
            let mesh = Mesh::new(&sizes).unwrap();
            let back = shard_and_assemble(&plan, mesh, &s);
            assert_eq!(back["frame_atom"], FRAMES, "mesh {sizes:?}");
            assert_eq!(back["atom_token"], OWNERS, "mesh {sizes:?}");
        }
    }
}

#[test]
fn a_negative_id_that_is_not_the_none_value_is_refused_by_name() {
    let plan = featshard_spec::compile_str("t.yaml", &spec("[cp0, cp1]"))
        .expect("spec")
        .1;
    let mut frames = FRAMES;
    frames[4] = -2;
    let e = place(
        &plan,
        Mesh::new(&[2, 2]).unwrap(),
        &sample(&frames, &OWNERS),
        &Options::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("feature `frame_atom`") && e.contains("found [-2, 5]"),
        "{e}"
    );
    // Without a none value, -1 is out of range, and the message says how to declare it.
    let text = spec("[cp0, cp1]").replacen("padded_global, none: -1", "padded_global", 1);
    let plan = featshard_spec::compile_str("t.yaml", &text)
        .expect("spec")
        .1;
    let e = place(
        &plan,
        Mesh::new(&[2, 2]).unwrap(),
        &sample(&FRAMES, &OWNERS),
        &Options::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("feature `frame_atom`") && e.contains("none: -1"),
        "{e}"
    );
}

/// Masks made from the lengths alone: 1 at every real item's padded position (tokens
/// end-padded, atoms in their owner's block), 0 at every pad, on a tile and one axis;
/// a given mask that says otherwise is refused.
#[test]
fn derived_validity_masks_are_one_on_real_items_and_zero_on_pads() {
    for axes in ["[cp0, cp1]", "[cp]"] {
        let text = format!(
            "{}  token_valid: {{axes: [tokens], dtype: bool, mask: tokens, derive: {{valid: true}}}}\n  \
             pair_valid: {{axes: [tokens, tokens], dtype: float32, mask: tokens, derive: {{valid: true}}}}\n  \
             atom_valid: {{axes: [atoms], dtype: int8, mask: atoms, derive: {{valid: true}}}}\n",
            spec(axes)
        );
        let plan = featshard_spec::compile_str("t.yaml", &text)
            .expect("spec")
            .1;
        let meshes: &[&[usize]] = if axes.contains(',') {
            &[&[3, 3], &[2, 1]]
        } else {
            &[&[4], &[3]]
        };
        for &sizes in meshes {
            let mesh = Mesh::new(sizes).unwrap();
            let placed =
                place(&plan, mesh, &sample(&FRAMES, &OWNERS), &Options::default()).expect("place");
            let lay = &placed.layout;
            let (tokens, atoms) = (lay.padded["tokens"], lay.padded["atoms"]);
            let real_atom: Vec<bool> = (0..atoms)
                .map(|p| match lay.positions.get("atoms") {
                    Some(pos) => pos.contains(&p),
                    None => p < lay.sizes["atoms"],
                })
                .collect();
            let padded = |name: &str| {
                let f = placed.blocks(&plan, name).expect(name);
                let mut bytes = Vec::new();
                f.write_part(&placed, Part::Padded, &mut bytes).unwrap();
                Array::owned(f.dtype, f.shape_of(&placed, Part::Padded), bytes).values()
            };
            let want_tokens: Vec<f64> = (0..tokens).map(|i| f64::from(u8::from(i < 5))).collect();
            assert_eq!(padded("token_valid"), want_tokens, "{sizes:?}");
            let pair: Vec<f64> = (0..tokens * tokens)
                .map(|k| f64::from(u8::from(k / tokens < 5 && k % tokens < 5)))
                .collect();
            assert_eq!(padded("pair_valid"), pair, "{sizes:?}");
            let want_atoms: Vec<f64> = real_atom.iter().map(|&r| f64::from(u8::from(r))).collect();
            assert_eq!(padded("atom_valid"), want_atoms, "{sizes:?}");
        }
        // A mask the sample gives is checked against the rule.
        let mut s = sample(&FRAMES, &OWNERS);
        s.insert(
            "token_valid".into(),
            Array::owned(DType::Bool, vec![5], vec![1, 1, 0, 1, 1]),
        );
        let e = place(
            &plan,
            Mesh::new(if axes.contains(',') { &[2, 2] } else { &[2] }).unwrap(),
            &s,
            &Options::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("feature `token_valid`") && e.contains("validity mask"),
            "{e}"
        );
    }
}

/// Atoms owned through an id vector, AlphaFold3's `atom_to_token_idx` (`[atoms]`, a
/// token id per atom), declared `shard_local`: local ids on a tile (atoms in their
/// token's block), padded global ids on one axis (atoms in serial order), as a one-hot
/// map's columns are; one spec for both. `atom_token_x` holds each atom's token's
/// `token_x`, so a gather of `token_x` by the delivered ids must give it back.
fn id_map_spec(mesh: &str, owned_by: &str) -> String {
    let scope = "shard_local";
    // Counts alone must be in every sample; beside a map they may be left out.
    let optional = if owned_by.contains("map") {
        ", optional: true"
    } else {
        ""
    };
    format!(
        "version: 1
module: t
mesh: {{cp: {mesh}}}
semantics:
  tokens: {{shard: true}}
  atoms: {{shard: true, owner: tokens, {owned_by}}}
features:
  atoms_per_token: {{axes: [tokens], dtype: int64{optional}}}
  atom_to_token_idx: {{axes: [atoms], dtype: int64, pad: -1, index: {{of: tokens, scope: {scope}}}}}
  token_x: {{axes: [tokens], dtype: float32}}
  atom_token_x: {{axes: [atoms], dtype: float32}}
"
    )
}

/// Tokens of 2, 0, 3, 1, 2 atoms, as an id vector (and its counts).
const TOKEN_OF_ATOM: [i64; 8] = [0, 0, 2, 2, 2, 3, 4, 4];

fn id_map_sample(ids: &[i64]) -> Sample<'static> {
    let token_x = [10.0f32, 11.0, 12.0, 13.0, 14.0];
    let floats = |v: Vec<f32>| {
        let n = v.len();
        Array::owned(
            DType::Float32,
            vec![n],
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    };
    let mut s = Sample::new();
    s.insert(
        "atom_to_token_idx".into(),
        ints(DType::Int64, vec![ids.len()], ids),
    );
    s.insert("token_x".into(), floats(token_x.to_vec()));
    let of_atom = ids
        .iter()
        .map(|&t| token_x[t.clamp(0, 4) as usize])
        .collect();
    s.insert("atom_token_x".into(), floats(of_atom));
    s
}

fn tile_and_axis_meshes() -> [(&'static str, Vec<Vec<usize>>); 2] {
    [
        (
            "[cp0, cp1]",
            vec![vec![3, 3], vec![2, 3], vec![2, 2], vec![1, 1]],
        ),
        ("[cp]", vec![vec![1], vec![2], vec![3], vec![4], vec![8]]),
    ]
}

#[test]
fn an_id_vector_owns_the_atoms_and_reaches_each_rank_as_ids_it_can_gather_by() {
    let s = id_map_sample(&TOKEN_OF_ATOM);
    for (axes, meshes) in tile_and_axis_meshes() {
        let compile = |owned_by: &str| {
            featshard_spec::compile_str("t.yaml", &id_map_spec(axes, owned_by))
                .expect("spec")
                .1
        };
        let plan = compile("map: atom_to_token_idx");
        let by_counts = compile("counts: atoms_per_token");
        let mut counted = s.clone();
        counted.insert(
            "atoms_per_token".into(),
            ints(DType::Int64, vec![5], &[2, 0, 3, 1, 2]),
        );
        for sizes in meshes {
            let mesh = Mesh::new(&sizes).unwrap();
            let placed = place(&plan, mesh, &s, &Options::default()).expect("place");
            let ranks = rank_blocks(&plan, &placed, mesh);
            // The same layout as the counts give: every atom's block where it was.
            let counted = place(&by_counts, mesh, &counted, &Options::default()).expect("place");
            let other = rank_blocks(&by_counts, &counted, mesh);
            let token_x_all: Vec<f64> = {
                let f = placed.blocks(&plan, "token_x").expect("token_x");
                let mut bytes = Vec::new();
                f.write_part(&placed, Part::Padded, &mut bytes).unwrap();
                Array::owned(f.dtype, f.shape_of(&placed, Part::Padded), bytes).values()
            };
            let mut real = 0;
            for (blocks, same) in ranks.iter().zip(&other) {
                assert_eq!(
                    blocks["atom_token_x"].values(),
                    same["atom_token_x"].values()
                );
                let ids = blocks["atom_to_token_idx"].values();
                let want = blocks["atom_token_x"].values();
                // The model's gather: shard-local ids into the rank's own token block,
                // padded global ids into the whole (gathered) token axis.
                let tokens = match axes.contains(',') {
                    true => blocks["token_x"].values(),
                    false => token_x_all.clone(),
                };
                for (&id, &w) in ids.iter().zip(&want) {
                    if id < 0.0 {
                        assert_eq!(w, 0.0, "a pad atom on {sizes:?}");
                        continue;
                    }
                    assert_eq!(tokens[id as usize], w, "mesh {sizes:?}: {ids:?} {tokens:?}");
                    real += 1;
                }
            }
            // Each real atom is on one rank of a tile row (cp1 replicates it).
            let copies = if axes.contains(',') { sizes[1] } else { 1 };
            assert_eq!(real, 8 * copies, "mesh {sizes:?}");
            let back = shard_and_assemble(&plan, mesh, &s);
            assert_eq!(back["atom_to_token_idx"], TOKEN_OF_ATOM, "mesh {sizes:?}");
        }
    }
}

#[test]
fn an_id_vector_that_names_no_owner_or_disagrees_with_the_counts_is_refused() {
    let place_on = |text: &str, s: &Sample| {
        let plan = featshard_spec::compile_str("t.yaml", text).expect("spec").1;
        place(&plan, Mesh::new(&[2, 2]).unwrap(), s, &Options::default())
            .unwrap_err()
            .to_string()
    };
    let text = id_map_spec("[cp0, cp1]", "map: atom_to_token_idx");
    let mut past = TOKEN_OF_ATOM;
    past[3] = 7;
    let e = place_on(&text, &id_map_sample(&past));
    assert!(e.contains("`atom_to_token_idx`") && e.contains("7"), "{e}");
    // -1 without a none value, or without `unowned_rows: pad`, owns nothing: refused.
    let mut none = TOKEN_OF_ATOM;
    none[7] = -1;
    let e = place_on(&text, &id_map_sample(&none));
    assert!(e.contains("`atom_to_token_idx`") && e.contains("-1"), "{e}");
    // Counts and an id vector given together must agree.
    let text = id_map_spec(
        "[cp0, cp1]",
        "counts: atoms_per_token, map: atom_to_token_idx",
    );
    let mut s = id_map_sample(&TOKEN_OF_ATOM);
    s.insert(
        "atoms_per_token".into(),
        ints(DType::Int64, vec![5], &[2, 0, 2, 2, 2]),
    );
    let e = place_on(&text, &s);
    assert!(
        e.contains("`atom_to_token_idx`") && e.contains("atoms_per_token"),
        "{e}"
    );
}

#[test]
fn atoms_an_id_vector_gives_no_token_are_pads_where_the_spec_says_so() {
    let text = id_map_spec("[cp0, cp1]", "map: atom_to_token_idx, unowned_rows: pad")
        .replace("scope: shard_local}", "scope: shard_local, none: -1}");
    let plan = featshard_spec::compile_str("t.yaml", &text)
        .expect("spec")
        .1;
    let mut ids = TOKEN_OF_ATOM.to_vec();
    ids.insert(3, -1);
    let placed = place(
        &plan,
        Mesh::new(&[2, 2]).unwrap(),
        &id_map_sample(&ids),
        &Options::default(),
    )
    .expect("place");
    assert_eq!(placed.layout.sizes["atoms"], 8);
    assert_eq!(placed.intake.unowned.get("atoms"), Some(&1));
}

#[test]
fn an_owner_map_that_is_neither_one_hot_nor_an_id_vector_is_refused_at_its_line() {
    for (feature, says) in [
        (
            "{axes: [atoms], dtype: float32, index: {of: tokens, scope: serial}}",
            "integer dtype",
        ),
        ("{axes: [atoms], dtype: int64}", "index: {of: tokens}"),
        ("{axes: [atoms, 3], dtype: int64}", "id vector"),
    ] {
        let text = id_map_spec("[cp0, cp1]", "map: atom_to_token_idx").replace(
            "{axes: [atoms], dtype: int64, pad: -1, index: {of: tokens, scope: shard_local}}",
            feature,
        );
        let e = match featshard_spec::compile_str("t.yaml", &text) {
            Ok(_) => panic!("{feature} accepted as an owner map"),
            Err(d) => d.render_plain(),
        };
        assert!(
            e.contains("atom_to_token_idx") && e.contains(says) && e.contains("t.yaml:"),
            "{e}"
        );
    }
}

/// Atoms of no token (id -1) dropped as pads (`unowned_rows: pad`) while frame ids point
/// into the atoms: the frames are renumbered past the dropped atoms and name the same
/// atoms after the way back; a frame naming a dropped atom is refused by name.
#[test]
fn ids_into_items_dropped_as_unowned_are_renumbered_or_refused() {
    let spec = "version: 1
module: t
mesh: {cp: [cp]}
semantics:
  tokens: {shard: true}
  atoms: {shard: true, owner: tokens, map: atom_token, unowned_rows: pad}
features:
  frame_atom: {axes: [tokens, 3], dtype: int64, pad: -1, index: {of: atoms, scope: padded_global, none: -1}}
  atom_token: {axes: [atoms], dtype: int64, pad: -1, index: {of: tokens, scope: shard_local, none: -1}}
  atom_serial: {axes: [atoms], dtype: int64}
";
    let plan = featshard_spec::compile_str("t.yaml", spec)
        .unwrap_or_else(|d| panic!("{}", d.render_plain()))
        .1;
    // Atom 2 and atom 5 belong to no token; the frames name atoms around them.
    let owners = [0i64, 0, -1, 1, 1, -1, 2, 2];
    let frames = [0i64, 1, -1, 3, 4, 3, 6, 7, -1];
    let given = |frames: &[i64]| {
        let mut s = Sample::new();
        s.insert("atom_token".into(), ints(DType::Int64, vec![8], &owners));
        s.insert("frame_atom".into(), ints(DType::Int64, vec![3, 3], frames));
        s.insert(
            "atom_serial".into(),
            ints(DType::Int64, vec![8], &[10, 11, 12, 13, 14, 15, 16, 17]),
        );
        s
    };
    for mesh in [vec![1], vec![2], vec![3]] {
        let back = shard_and_assemble(&plan, Mesh::new(&mesh).unwrap(), &given(&frames));
        // The kept atoms in order, and each frame naming the same atom as before.
        assert_eq!(
            back["atom_serial"],
            vec![10, 11, 13, 14, 16, 17],
            "{mesh:?}"
        );
        assert_eq!(back["atom_token"], vec![0, 0, 1, 1, 2, 2], "{mesh:?}");
        assert_eq!(
            back["frame_atom"],
            vec![0, 1, -1, 2, 3, 2, 4, 5, -1],
            "{mesh:?}"
        );
    }
    let mut naming_dropped = frames;
    naming_dropped[1] = 5;
    let mesh = Mesh::new(&[2]).unwrap();
    let Err(e) = place(&plan, mesh, &given(&naming_dropped), &Options::default()) else {
        panic!("a frame naming a dropped atom was placed");
    };
    let e = e.to_string();
    assert!(
        e.contains("feature `frame_atom`")
            && e.contains("names item 5 of `atoms`, which has no owner and is dropped as a pad"),
        "{e}"
    );
}
