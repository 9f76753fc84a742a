//! OpenFold3's real output (tests/data/openfold3: plain, padded to a token budget, a
//! collated batch's row) through `featshard shard` and `assemble` with
//! `examples/openfold3.yaml`, taken as it comes: on 2-D tiles and one CP axis of 1 to 8,
//! in owner blocks and in windows, every rank's blocks are checked by meaning (each
//! atom's token on its rank, each token's first atom, pads, the pair tiles and slabs),
//! and `assemble` gives every key back, byte for byte, without the featurizer's pads.
#![cfg(feature = "runtime")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod support;

use support::cli::{root, run};
use tch::{Kind, Tensor};

const TILES: [&str; 3] = ["3x3", "2x3", "2x2"];
const ONE_AXIS: [&str; 8] = ["1", "2", "3", "4", "5", "6", "7", "8"];
const FORMS: [&str; 3] = ["plain", "padded", "collated"];

fn read(path: &Path) -> BTreeMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

fn sample_path(form: &str) -> PathBuf {
    root().join(format!("tests/data/openfold3/{form}.safetensors"))
}

/// The shipped spec; on one axis its `mesh:` line changed; with `windows` its atoms in
/// serial windows; for the collated form its `[1]` settings scalars.
fn spec_for(dir: &Path, form: &str, one_axis: bool, windows: bool) -> String {
    let mut text = std::fs::read_to_string(root().join("examples/openfold3.yaml")).unwrap();
    if windows {
        let at = text.find("    window: 32").expect("the atoms' window");
        text.insert_str(at, "    layout: windows\n");
    }
    if one_axis {
        assert!(text.contains("cp: [cp_axis_0, cp_axis_1]"));
        text = text.replace("cp: [cp_axis_0, cp_axis_1]", "cp: [cp]");
    }
    if form == "collated" {
        text = text.replace("axes: [1]", "axes: []");
    }
    let path = dir.join(format!("of3-{form}-{one_axis}-{windows}.yaml"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn ints(x: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(x.to_kind(Kind::Int64).flatten(0, -1)).unwrap()
}

/// Each atom by what is its own: its residue's reference space and reference position.
fn atom_keys(b: &BTreeMap<String, Tensor>) -> Vec<(i64, Vec<u32>)> {
    let uid = ints(&b["ref_space_uid"]);
    let pos = &b["ref_pos"];
    (0..pos.size()[0])
        .map(|i| {
            let p = Vec::<f32>::try_from(pos.get(i)).unwrap();
            (uid[i as usize], p.iter().map(|v| v.to_bits()).collect())
        })
        .collect()
}

/// The sample's real part: every axis of the token budget's and the collator's length
/// cut to the real tokens and atoms (what featshard takes in and `assemble` gives back).
fn real_part(sample: &BTreeMap<String, Tensor>) -> BTreeMap<String, Tensor> {
    let real = |mask: &str| ints(&sample[mask]).iter().filter(|&&m| m == 1).count() as i64;
    let cuts = [
        (sample["token_mask"].size()[0], real("token_mask")),
        (sample["atom_mask"].size()[0], real("atom_mask")),
    ];
    sample
        .iter()
        .map(|(k, x)| {
            let mut y = x.shallow_clone();
            for (d, &n) in x.size().iter().enumerate() {
                if let Some(&(_, r)) = cuts.iter().find(|(len, r)| *len == n && r < len) {
                    y = y.narrow(d as i64, 0, r);
                }
            }
            (k.clone(), y)
        })
        .collect()
}

/// Every rank's blocks by meaning: a real atom (known by its key) names, by its
/// delivered token id, the token the featurizer gave it (shard-local in the rank's token
/// block on a tile in owner blocks, global in the padded token axis otherwise); a pad
/// atom has mask 0 and id 0; each real token's first atom, a padded global position, is
/// the featurizer's first atom of that token; every real atom and token is seen on one
/// rank of each tile row.
fn check_blocks(
    mesh: &str,
    shards: &Path,
    serial: &BTreeMap<String, Tensor>,
    padded: &Path,
    windows: bool,
) {
    let keys = atom_keys(serial);
    let token_of: BTreeMap<_, i64> = keys
        .iter()
        .cloned()
        .zip(ints(&serial["atom_to_token_index"]))
        .collect();
    assert_eq!(
        token_of.len(),
        keys.len(),
        "every atom has a key of its own"
    );
    let first_atom = ints(&serial["start_atom_index"]);
    let whole = read(padded);
    let (whole_tokens, whole_keys) = (ints(&whole["token_index"]), atom_keys(&whole));
    let tile = mesh.contains('x');
    let ranks: usize = mesh
        .split('x')
        .map(|s| s.parse::<usize>().unwrap())
        .product();
    let (mut atoms_seen, mut tokens_seen) = (0, 0);
    for r in 0..ranks {
        let b = read(&shards.join(format!("rank-{r}.safetensors")));
        let tokens = match tile && !windows {
            true => ints(&b["token_index"]),
            false => whole_tokens.clone(),
        };
        let (ids, mask) = (ints(&b["atom_to_token_index"]), ints(&b["atom_mask"]));
        for ((key, &id), &real) in atom_keys(&b).iter().zip(&ids).zip(&mask) {
            if real == 0 {
                assert_eq!(
                    (id, key.1.iter().all(|&v| v == 0)),
                    (0, true),
                    "{mesh} rank {r}: a pad atom"
                );
                continue;
            }
            let got = usize::try_from(id).ok().and_then(|i| tokens.get(i));
            assert_eq!(
                got,
                token_of.get(key),
                "{mesh} rank {r}: an atom's token id {id}"
            );
            atoms_seen += 1;
        }
        let token_mask = ints(&b["token_mask"]);
        for ((&t, &start), &real) in ints(&b["token_index"])
            .iter()
            .zip(&ints(&b["start_atom_index"]))
            .zip(&token_mask)
        {
            if real == 0 {
                continue;
            }
            let at = usize::try_from(start).expect("a real token's first atom");
            assert_eq!(
                whole_keys.get(at),
                keys.get(first_atom[t as usize] as usize),
                "{mesh} rank {r}: token {t}'s first atom"
            );
            tokens_seen += 1;
        }
        check_pair(mesh, r, &b, &serial["token_bonds"]);
    }
    let copies: usize = match mesh.split_once('x') {
        Some((_, cp1)) => cp1.parse().unwrap(),
        None => 1,
    };
    assert_eq!(atoms_seen, keys.len() * copies, "{mesh}: real atoms seen");
    assert_eq!(
        tokens_seen,
        first_atom.len() * copies,
        "{mesh}: real tokens seen"
    );
}

/// A pair block is the serial tile (2-D) or row slab (one axis) of the rank's tokens:
/// rows its `token_index` block, columns its cp1 block or every token; pads 0.
fn check_pair(mesh: &str, rank: usize, b: &BTreeMap<String, Tensor>, serial: &Tensor) {
    let n = serial.size()[0];
    let block = &b["token_bonds"];
    let (rows, cols) = (block.size()[0], block.size()[1]);
    let (row_tokens, real) = (ints(&b["token_index"]), ints(&b["token_mask"]));
    let col0 = match mesh.split_once('x') {
        Some((_, cp1)) => (rank % cp1.parse::<usize>().unwrap()) as i64 * cols,
        None => 0,
    };
    for i in 0..rows {
        for j in 0..cols {
            let (t, u) = (row_tokens[i as usize], col0 + j);
            let want = match real[i as usize] == 1 && u < n {
                true => serial.double_value(&[t, u]),
                false => 0.0,
            };
            assert_eq!(
                block.double_value(&[i, j]),
                want,
                "{mesh} rank {rank}: token_bonds [{i}, {j}]"
            );
        }
    }
}

#[test]
fn openfold3_samples_in_every_form_shard_right_and_come_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    for form in FORMS {
        let input = sample_path(form).display().to_string();
        let serial = real_part(&read(&sample_path(form)));
        let layouts = TILES
            .iter()
            .chain(&ONE_AXIS)
            .map(|&m| (m, false))
            .chain(["3x3", "2x3", "2x2", "1", "3", "8"].map(|m| (m, true)));
        for (mesh, windows) in layouts {
            let spec = spec_for(dir.path(), form, !mesh.contains('x'), windows);
            let at = |what: &str| {
                dir.path()
                    .join(format!("{form}-{mesh}-{windows}-{what}"))
                    .display()
                    .to_string()
            };
            let encodings: &[&str] = match mesh {
                "3x3" | "4" => &["dense", "compact"],
                _ => &["dense"],
            };
            for &encoding in encodings {
                let args = [
                    "--mesh",
                    mesh,
                    "--encoding",
                    encoding,
                    "--out",
                    &at(encoding),
                ];
                run(&[&["shard", &spec, "--features", &input][..], &args].concat());
                run(&[
                    "assemble",
                    &spec,
                    "--shards",
                    &at(encoding),
                    "--out",
                    &at(&format!("{encoding}.safetensors")),
                ]);
            }
            run(&[
                "assemble",
                &spec,
                "--shards",
                &at("dense"),
                "--padded",
                "--out",
                &at("padded.safetensors"),
            ]);
            if encodings.len() == 2 {
                let file = |e: &str| std::fs::read(at(&format!("{e}.safetensors"))).unwrap();
                assert!(
                    file("dense") == file("compact"),
                    "{form} {mesh}: compact and dense differ"
                );
            }
            let back = read(Path::new(&at("dense.safetensors")));
            assert_eq!(back.len(), serial.len(), "{form} {mesh}: keys");
            for (k, x) in &serial {
                let y = back
                    .get(k)
                    .unwrap_or_else(|| panic!("{form} {mesh}: `{k}` did not come back"));
                assert_eq!(
                    (x.kind(), x.size()),
                    (y.kind(), y.size()),
                    "{form} {mesh}: {k}"
                );
                assert!(
                    x.equal(y),
                    "{form} {mesh}: `{k}` differs after the round trip"
                );
            }
            let padded = PathBuf::from(at("padded.safetensors"));
            check_blocks(mesh, Path::new(&at("dense")), &serial, &padded, windows);
        }
    }
}
