//! A map delivered in the other form than the sample gives it (`index: {deliver: ...}`):
//! a one-hot map delivered as ids reaches every rank exactly as the same map given as an
//! id vector does, an id vector delivered as a one-hot exactly as the same map given
//! one-hot, on tiles and on one axis, in owner blocks and in windows; `assemble` gives
//! each back in the form the sample gave, byte for byte.

use featshard_exec::array::Array;
use featshard_exec::blocks::{feature_blocks, Part};
use featshard_exec::files::Sample;
use featshard_exec::{assemble, place, Options};
use featshard_spec::ir::DType;
use featshard_spec::plan::Plan;
use featshard_spec::Mesh;

/// Tokens of 2, 0, 3, 1, 2 atoms.
const TOKEN_OF_ATOM: [i64; 8] = [0, 0, 2, 2, 2, 3, 4, 4];
const TOKENS: usize = 5;

/// `map` declared as written, owning the atoms; `layout` the atoms' layout keys.
fn spec(mesh: &str, layout: &str, map: &str) -> Plan {
    let text = format!(
        "version: 1
module: t
mesh: {{cp: {mesh}}}
semantics:
  tokens: {{shard: true}}
  atoms: {{shard: true, owner: tokens, map: atom_to_token{layout}}}
features:
  atom_to_token: {map}
  token_x: {{axes: [tokens], dtype: float32}}
  atom_x: {{axes: [atoms], dtype: float32}}
"
    );
    featshard_spec::compile_str("t.yaml", &text)
        .expect("spec")
        .1
}

const IDS: &str = "{axes: [atoms], dtype: int64, pad: -1, index: {of: tokens, scope: shard_local}}";
const ONE_HOT: &str =
    "{axes: [atoms, tokens], dtype: int64, coshard: [{axis: 1, follows: 0}], index: {of: tokens, scope: shard_local, one_hot: 1}}";

fn with_deliver(map: &str, form: &str) -> String {
    map.replace(
        "scope: shard_local",
        &format!("scope: shard_local, deliver: {form}"),
    )
}

fn ids() -> Array<'static> {
    Array::owned(
        DType::Int64,
        vec![TOKEN_OF_ATOM.len()],
        TOKEN_OF_ATOM.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
}

fn one_hot(d: DType) -> Array<'static> {
    let one = |c: bool| match d {
        DType::Float32 => f32::from(u8::from(c)).to_le_bytes().to_vec(),
        _ => i64::from(c).to_le_bytes().to_vec(),
    };
    let bytes = TOKEN_OF_ATOM
        .iter()
        .flat_map(|&t| (0..TOKENS as i64).flat_map(move |c| one(c == t)))
        .collect();
    Array::owned(d, vec![TOKEN_OF_ATOM.len(), TOKENS], bytes)
}

fn sample(map: Array<'static>) -> Sample<'static> {
    let floats = |v: Vec<f32>| {
        let n = v.len();
        Array::owned(
            DType::Float32,
            vec![n],
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    };
    let mut s = Sample::new();
    s.insert("atom_to_token".into(), map);
    s.insert(
        "token_x".into(),
        floats((0..TOKENS).map(|t| 10.0 + t as f32).collect()),
    );
    s.insert("atom_x".into(), floats((0..8).map(|a| a as f32).collect()));
    s
}

type Blocks = Vec<Vec<(String, DType, Vec<usize>, Vec<u8>)>>;

/// Every rank's dense blocks, and the serial sample `assemble` gives back.
fn shard(plan: &Plan, mesh: Mesh, s: &Sample) -> (Blocks, Sample<'static>) {
    let placed = place(plan, mesh, s, &Options::default()).expect("place");
    let all = feature_blocks(plan, &placed).expect("blocks");
    let mut ranks: Vec<Sample> = Vec::new();
    let mut blocks: Blocks = Vec::new();
    for rank in 0..mesh.ranks() {
        let coord = mesh.coord(rank);
        let mut mine = Sample::new();
        let mut listed = Vec::new();
        for f in all.iter().filter(|f| f.is_placed()) {
            let shape = f.shape_of(&placed, Part::Block(coord));
            let mut bytes = Vec::new();
            f.write_part(&placed, Part::Block(coord), &mut bytes)
                .unwrap();
            listed.push((f.name.clone(), f.dtype, shape.clone(), bytes.clone()));
            mine.insert(f.name.clone(), Array::owned(f.dtype, shape, bytes));
        }
        ranks.push(mine);
        blocks.push(listed);
    }
    let padded = assemble::assemble(plan, &placed.layout, None, &ranks).expect("assemble");
    let serial = assemble::unpad(plan, &placed.layout, padded).expect("unpad");
    let direct = assemble::assemble_serial(plan, &placed.layout, None, &ranks).expect("serial");
    assert_eq!(
        direct, serial,
        "the serial assembler differs from unpad of the padded"
    );
    let back = serial
        .into_iter()
        .map(|(n, d)| (n, Array::owned(d.dtype, d.shape, d.bytes)))
        .collect();
    (blocks, back)
}

fn meshes() -> Vec<(&'static str, Vec<usize>)> {
    let tile = [vec![3, 3], vec![2, 3], vec![2, 2], vec![1, 1]].map(|m| ("[cp0, cp1]", m));
    let axis = [vec![1], vec![2], vec![3], vec![4], vec![8]].map(|m| ("[cp]", m));
    tile.into_iter().chain(axis).collect()
}

fn same_array(a: &Array, b: &Array) -> bool {
    a.dtype() == b.dtype()
        && a.shape() == b.shape()
        && a.contiguous().base_bytes() == b.contiguous().base_bytes()
}

#[test]
fn a_one_hot_map_delivered_as_ids_reaches_every_rank_as_the_id_vector_does() {
    for layout in ["", ", layout: windows, window: 2"] {
        for (axes, sizes) in meshes() {
            let mesh = Mesh::new(&sizes).unwrap();
            let as_ids = spec(axes, layout, &with_deliver(ONE_HOT, "ids"));
            let declared_ids = spec(axes, layout, IDS);
            let (want, _) = shard(&declared_ids, mesh, &sample(ids()));
            for given in [one_hot(DType::Int64), one_hot(DType::Float32), ids()] {
                let plan = match given.dtype() {
                    DType::Float32 => spec(
                        axes,
                        layout,
                        &with_deliver(ONE_HOT, "ids").replace("int64, coshard", "float32, coshard"),
                    ),
                    _ => as_ids.clone(),
                };
                let (got, back) = shard(&plan, mesh, &sample(given.clone()));
                assert_eq!(
                    got,
                    want,
                    "{axes} {sizes:?}{layout}, given {:?}",
                    given.shape()
                );
                // The way back is the sample's form: a one-hot map (given dense or as
                // its indices, as a one-hot map given as indices comes back).
                let dense = match given.dim() {
                    2 => given.clone(),
                    _ => one_hot(DType::Int64),
                };
                assert!(
                    same_array(&back["atom_to_token"], &dense),
                    "{axes} {sizes:?}{layout}"
                );
            }
        }
    }
}

#[test]
fn an_id_vector_delivered_as_one_hot_reaches_every_rank_as_the_one_hot_map_does() {
    for (axes, sizes) in meshes() {
        let mesh = Mesh::new(&sizes).unwrap();
        let (want, _) = shard(
            &spec(axes, "", ONE_HOT),
            mesh,
            &sample(one_hot(DType::Int64)),
        );
        let (got, back) = shard(
            &spec(axes, "", &with_deliver(IDS, "one_hot")),
            mesh,
            &sample(ids()),
        );
        assert_eq!(got, want, "{axes} {sizes:?}");
        assert!(
            same_array(&back["atom_to_token"], &ids()),
            "{axes} {sizes:?}"
        );
    }
}

#[test]
fn a_map_that_is_not_what_its_given_form_says_is_refused_by_name() {
    let plan = spec("[cp0, cp1]", "", &with_deliver(ONE_HOT, "ids"));
    let refused = |map: Array<'static>| {
        place(
            &plan,
            Mesh::new(&[2, 2]).unwrap(),
            &sample(map),
            &Options::default(),
        )
        .unwrap_err()
        .to_string()
    };
    let mut bytes = one_hot(DType::Int64).base_bytes().to_vec();
    bytes[(3 * TOKENS + 4) * 8] = 1; // atom 3 in tokens 2 and 4
    let e = refused(Array::owned(DType::Int64, vec![8, TOKENS], bytes.clone()));
    assert!(
        e.contains("`atom_to_token`") && e.contains("row 3") && e.contains("columns 2 and 4"),
        "{e}"
    );
    bytes[(3 * TOKENS + 4) * 8] = 0;
    bytes[(3 * TOKENS + 2) * 8] = 2;
    let e = refused(Array::owned(DType::Int64, vec![8, TOKENS], bytes));
    assert!(
        e.contains("`atom_to_token`") && e.contains("holds 2"),
        "{e}"
    );
    let wide: Vec<u8> = TOKEN_OF_ATOM
        .iter()
        .flat_map(|&t| (0..6i64).flat_map(move |c| i64::from(c == t).to_le_bytes()))
        .collect();
    let e = refused(Array::owned(DType::Int64, vec![8, 6], wide));
    assert!(
        e.contains("`atom_to_token`") && e.contains("6 `tokens` wide") && e.contains("give 5"),
        "{e}"
    );
    // An id vector delivered as a one-hot takes -1 only where it declares none.
    let plan = spec("[cp0, cp1]", "", &with_deliver(IDS, "one_hot"));
    let mut none = TOKEN_OF_ATOM;
    none[7] = -1;
    let map = Array::owned(
        DType::Int64,
        vec![8],
        none.iter().flat_map(|v| v.to_le_bytes()).collect(),
    );
    let e = place(
        &plan,
        Mesh::new(&[2, 2]).unwrap(),
        &sample(map),
        &Options::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`atom_to_token`") && e.contains("-1") && e.contains("none: -1"),
        "{e}"
    );
}

#[test]
fn a_delivery_form_that_does_not_fit_the_feature_is_refused_at_its_line() {
    for (map, says) in [
        (with_deliver(IDS, "dense"), "unknown delivery form `dense`"),
        (with_deliver(IDS, "one_hot").replace("shard_local", "padded_global"), "scope: shard_local"),
        (
            "{axes: [atoms], dtype: float32, index: {of: tokens, scope: shard_local, deliver: one_hot}}".to_owned(),
            "integers",
        ),
        (
            "{axes: [atoms, 3], dtype: int64, index: {of: tokens, scope: shard_local, deliver: ids}}".to_owned(),
            "changes the form of a map",
        ),
    ] {
        let text = format!(
            "version: 1\nmodule: t\nmesh: {{cp: [cp]}}\nsemantics:\n  tokens: {{shard: true}}\n  atoms: {{shard: true, owner: tokens, map: atom_to_token}}\nfeatures:\n  atom_to_token: {map}\n"
        );
        let e = match featshard_spec::compile_str("t.yaml", &text) {
            Ok(_) => panic!("{map} accepted"),
            Err(d) => d.render_plain(),
        };
        assert!(e.contains("atom_to_token") && e.contains(says) && e.contains("t.yaml:8"), "{map}: {e}");
    }
}
