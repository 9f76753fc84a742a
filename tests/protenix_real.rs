//! A real AlphaFold3-family sample (Protenix 2.0.0's featurizer, `tests/data/protenix`)
//! through `featshard shard` and `assemble` with `examples/protenix.yaml`, unchanged:
//! token ids per atom as the atoms' owner map, `-1` frame atoms, no pad masks, a nested
//! `constraint_feature` dict (its keys joined by `.`). On 2-D tiles and one CP axis,
//! every rank's blocks are checked by meaning, and the round trip gives the sample back.
#![cfg(feature = "runtime")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod support;

use support::cli::{featshard, root, run};
use tch::{Kind, Tensor};

const MESHES: [&str; 9] = ["3x3", "2x3", "2x2", "1x1", "1", "2", "3", "4", "8"];

fn sample_path() -> PathBuf {
    root().join("tests/data/protenix/small_complex.safetensors")
}

fn read(path: &Path) -> BTreeMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

/// The shipped spec (atoms in windows, with the atom attention's key halos); without
/// `windows`, the same in owner blocks (no `layout: windows`, no halo); on one axis its
/// `mesh:` line changed.
fn spec_for(mesh: &str, dir: &Path, windows: bool) -> String {
    let shipped = root().join("examples/protenix.yaml");
    if mesh.contains('x') && windows {
        return shipped.display().to_string();
    }
    let mut text = std::fs::read_to_string(&shipped).unwrap();
    assert!(text.contains("    layout: windows") && text.contains("derive: {halo:"));
    if !windows {
        text = text
            .lines()
            .filter(|l| !l.contains("layout: windows") && !l.contains("derive: {halo:"))
            .map(|l| format!("{l}\n"))
            .collect();
    }
    if !mesh.contains('x') {
        assert!(text.contains("cp: [cp_axis_0, cp_axis_1]"));
        text = text.replace("cp: [cp_axis_0, cp_axis_1]", "cp: [cp]");
    }
    let path = dir.join(format!("protenix-{}-{windows}.yaml", mesh.contains('x')));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// `featshard shard SPEC --features INPUT --mesh 2x2 --out OUT`: whether it succeeded,
/// and what it said on stderr.
fn shard_2x2(spec: &Path, input: &Path, out: &Path) -> (bool, String) {
    let path = |p: &Path| p.display().to_string();
    let args = [
        "shard",
        &path(spec),
        "--features",
        &path(input),
        "--mesh",
        "2x2",
        "--out",
        &path(out),
    ];
    let run = featshard(&args);
    (
        run.status.success(),
        String::from_utf8_lossy(&run.stderr).into_owned(),
    )
}

fn ints(x: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(x.to_kind(Kind::Int64).flatten(0, -1)).unwrap()
}

fn rows(x: &Tensor) -> Vec<Vec<f32>> {
    let n = x.size()[0];
    (0..n)
        .map(|i| Vec::<f32>::try_from(x.get(i).to_kind(Kind::Float).flatten(0, -1)).unwrap())
        .collect()
}

/// Each atom's token id is right on its rank: every atom of a rank's block (known by its
/// reference position, unique per atom) gathers, by the id delivered with it, the token
/// the featurizer gave it; shard-local ids from the rank's own token block on a tile in
/// owner blocks, global ids from the whole token axis on one axis and with `windows`
/// (atoms in serial order, each rank's block a whole number of 32-atom windows). The
/// derived masks are 1 on exactly the real atoms and tokens, and a `-1` frame atom stays
/// `-1`.
fn check_blocks(
    mesh: &str,
    shards: &Path,
    sample: &BTreeMap<String, Tensor>,
    padded: &Path,
    windows: bool,
) {
    let serial_token: BTreeMap<Vec<u32>, i64> = rows(&sample["ref_pos"])
        .into_iter()
        .map(|r| r.iter().map(|v| v.to_bits()).collect())
        .zip(ints(&sample["atom_to_token_idx"]))
        .collect();
    let serial_bonds = sample["token_bonds"].shallow_clone();
    let tile = mesh.contains('x');
    let ranks: usize = mesh
        .split('x')
        .map(|s| s.parse::<usize>().unwrap())
        .product();
    let whole_tokens = ints(&read(padded)["token_index"]);
    let (mut atoms_seen, mut tokens_real) = (0, 0);
    for r in 0..ranks {
        let b = read(&shards.join(format!("rank-{r}.safetensors")));
        let ids = ints(&b["atom_to_token_idx"]);
        let tokens = if tile && !windows {
            ints(&b["token_index"])
        } else {
            whole_tokens.clone()
        };
        if windows {
            serial_windows(mesh, r, &b, sample);
            key_halos(mesh, r, &b, &read(padded));
        }
        let mask = ints(&b["atom_mask"]);
        for ((pos, &id), &real) in rows(&b["ref_pos"]).iter().zip(&ids).zip(&mask) {
            let key: Vec<u32> = pos.iter().map(|v| v.to_bits()).collect();
            match serial_token.get(&key) {
                Some(&t) if real == 1 => {
                    let got = usize::try_from(id).ok().and_then(|i| tokens.get(i));
                    assert_eq!(got, Some(&t), "{mesh} rank {r}: an atom's token id {id}");
                    atoms_seen += 1;
                }
                _ => assert!(
                    real == 0 && id == -1,
                    "{mesh} rank {r}: a pad atom {id} {real}"
                ),
            }
        }
        let token_mask = ints(&b["token_mask"]);
        tokens_real += token_mask.iter().filter(|&&m| m == 1).count();
        let frames = ints(&b["frame_atom_index"]);
        for (k, &m) in token_mask.iter().enumerate() {
            if m == 0 {
                assert_eq!(
                    &frames[3 * k..3 * k + 3],
                    &[-1, -1, -1],
                    "{mesh}: a pad token's frame"
                );
            }
        }
        check_pair(mesh, r, &b, &serial_bonds);
    }
    // Every real atom on one rank of its tile row (cp1 copies it), tokens likewise.
    let (atoms, tokens) = (sample["ref_pos"].size()[0], sample["token_index"].size()[0]);
    let copies: usize = if tile {
        mesh.split('x').nth(1).unwrap().parse().unwrap()
    } else {
        1
    };
    assert_eq!(atoms_seen, atoms as usize * copies, "{mesh}: atoms seen");
    assert_eq!(tokens_real, tokens as usize * copies, "{mesh}: real tokens");
}

/// A pair feature's block is the serial pair tile (2-D) or row slab (one axis) of the
/// rank's tokens: rows the tokens of its `token_index` block, columns those of its cp1
/// coordinate's block (tokens end-padded) or every token; pads 0.
fn check_pair(mesh: &str, rank: usize, b: &BTreeMap<String, Tensor>, serial: &Tensor) {
    let n = serial.size()[0];
    let block = &b["token_bonds"];
    let (rows, cols) = (block.size()[0], block.size()[1]);
    let row_tokens = ints(&b["token_index"]);
    let real = ints(&b["token_mask"]);
    let col0 = match mesh.split_once('x') {
        Some((_, cp1)) => (rank % cp1.parse::<usize>().unwrap()) as i64 * cols,
        None => 0,
    };
    for i in 0..rows {
        for j in 0..cols {
            let got = block.double_value(&[i, j]);
            let (t, u) = (row_tokens[i as usize], col0 + j);
            let want = match real[i as usize] == 1 && u < n {
                true => serial.double_value(&[t, u]),
                false => 0.0,
            };
            assert_eq!(got, want, "{mesh} rank {rank}: token_bonds at [{i}, {j}]");
        }
    }
}

/// Every key halo of a rank (`<feature>_keys`: dense, one-hot, of the derived
/// `atom_mask`) is the 48 atoms before its block of the padded atom axis and the 48
/// after, 0 past either end.
fn key_halos(
    mesh: &str,
    rank: usize,
    b: &BTreeMap<String, Tensor>,
    whole: &BTreeMap<String, Tensor>,
) {
    let block = b["ref_pos"].size()[0];
    let row = match mesh.split_once('x') {
        Some((_, cp1)) => rank / cp1.parse::<usize>().unwrap(),
        None => rank,
    } as i64;
    let mut seen = 0;
    for (name, keys) in b.iter().filter(|(n, _)| n.ends_with("_keys")) {
        let x = &whole[name.strip_suffix("_keys").unwrap()];
        let mut edge = x.size();
        edge[0] = 48;
        let zeros = Tensor::zeros(edge.as_slice(), (x.kind(), x.device()));
        let around = Tensor::cat(&[&zeros, x, &zeros], 0);
        let start = row * block + 48;
        let want = Tensor::cat(
            &[
                around.narrow(0, start - 48, 48),
                around.narrow(0, start + block, 48),
            ],
            0,
        );
        assert!(
            keys.equal(&want),
            "{mesh} rank {rank}: `{name}` is not the atoms around the block"
        );
        seen += 1;
    }
    assert_eq!(seen, 7, "{mesh} rank {rank}: the key halos");
}

/// With `layout: windows`, a rank's atoms are a whole number of 32-atom windows and the
/// serial atoms of its block's span, in order (pads only after the last atom).
fn serial_windows(
    mesh: &str,
    rank: usize,
    b: &BTreeMap<String, Tensor>,
    sample: &BTreeMap<String, Tensor>,
) {
    let block = b["ref_pos"].size()[0] as usize;
    assert_eq!(block % 32, 0, "{mesh} rank {rank}: {block} atoms");
    let row = match mesh.split_once('x') {
        Some((_, cp1)) => rank / cp1.parse::<usize>().unwrap(),
        None => rank,
    };
    let serial = rows(&sample["ref_pos"]);
    for (k, got) in rows(&b["ref_pos"]).iter().enumerate() {
        let at = row * block + k;
        let want = serial.get(at).cloned().unwrap_or_else(|| vec![0.0; 3]);
        assert_eq!(got, &want, "{mesh} rank {rank}: atom {at}");
    }
}

#[test]
fn a_protenix_sample_goes_in_unchanged_and_comes_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let sample = read(&sample_path());
    assert!(
        sample.contains_key("constraint_feature.contact"),
        "the nested dict's keys"
    );
    assert!(
        ints(&sample["frame_atom_index"]).contains(&-1),
        "an ion's frame is -1"
    );
    let input = sample_path().display().to_string();
    for (mesh, windows) in MESHES.iter().flat_map(|&m| [(m, false), (m, true)]) {
        let spec = spec_for(mesh, dir.path(), windows);
        let at = |what: &str| {
            dir.path()
                .join(format!("{mesh}-{windows}-{what}"))
                .display()
                .to_string()
        };
        for encoding in ["dense", "compact"] {
            let out = at(encoding);
            let args = ["--mesh", mesh, "--encoding", encoding, "--out", &out];
            run(&[&["shard", &spec, "--features", &input][..], &args].concat());
        }
        for (folder, padded) in [
            ("dense", false),
            ("compact", false),
            ("dense", true),
            ("compact", true),
        ] {
            let (shards, out) = (at(folder), at(&format!("{folder}-{padded}.safetensors")));
            let mut args = vec!["assemble", &spec, "--shards", &shards, "--out", &out];
            if padded {
                args.push("--padded");
            }
            run(&args);
        }
        // Compact rank files assemble to the bytes the dense ones do.
        for padded in [false, true] {
            let file = |f: &str| std::fs::read(at(&format!("{f}-{padded}.safetensors"))).unwrap();
            assert!(
                file("dense") == file("compact"),
                "{mesh}: compact and dense differ"
            );
        }
        // The serial round trip: every key of the sample, its dtype, shape and values.
        let back = read(Path::new(&at("dense-false.safetensors")));
        for (k, x) in &sample {
            let y = back
                .get(k)
                .unwrap_or_else(|| panic!("{mesh}: `{k}` did not come back"));
            assert_eq!((x.kind(), x.size()), (y.kind(), y.size()), "{mesh}: {k}");
            assert!(x.equal(y), "{mesh}: `{k}` differs after the round trip");
        }
        let padded = PathBuf::from(at("dense-true.safetensors"));
        check_blocks(mesh, Path::new(&at("dense")), &sample, &padded, windows);
    }
}

/// A sample file that joins the nested dict's keys with `/`, under a spec that says so
/// (`separator: /`): read as the spec's paths, written back under the file's own keys.
#[test]
fn a_declared_separator_reads_and_writes_the_files_own_keys() {
    let dir = tempfile::tempdir().unwrap();
    let sample = read(&sample_path());
    let slashed: Vec<(String, Tensor)> = sample
        .iter()
        .map(|(k, x)| (k.replace('.', "/"), x.shallow_clone()))
        .collect();
    let input = dir.path().join("slashed.safetensors");
    Tensor::write_safetensors(&slashed, &input).unwrap();
    let text = std::fs::read_to_string(root().join("examples/protenix.yaml")).unwrap();
    let spec = dir.path().join("protenix_slash.yaml");
    std::fs::write(&spec, format!("{text}\nseparator: /\n")).unwrap();
    let (spec, shards) = (spec.display().to_string(), dir.path().join("s"));
    let (shards, back) = (
        shards.display().to_string(),
        dir.path().join("back.safetensors"),
    );
    let input = input.display().to_string();
    run(&[
        "shard",
        &spec,
        "--features",
        &input,
        "--mesh",
        "2x2",
        "--out",
        &shards,
    ]);
    let back_path = back.display().to_string();
    run(&["assemble", &spec, "--shards", &shards, "--out", &back_path]);
    let back = read(&back);
    assert!(
        back.contains_key("constraint_feature/contact"),
        "{:?}",
        back.keys()
    );
    for (k, x) in &slashed {
        assert!(back[k].equal(x), "`{k}` differs after the round trip");
    }
    // The same file under the default separator: its `/` keys are no features, and the
    // message says which separator they use.
    let out = featshard(&[
        "shard",
        &root().join("examples/protenix.yaml").display().to_string(),
        "--features",
        &input,
        "--mesh",
        "2x2",
        "--out",
        &dir.path().join("t").display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("declare `separator: \"/\"`"),
        "{err}"
    );
}

/// One feature under two keys (`constraint_feature/pocket` and `constraint_feature.pocket`
/// with `separator: /`, holding different values) is refused naming both keys: no key
/// silently wins.
#[test]
fn a_feature_given_under_two_keys_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let mut given: Vec<(String, Tensor)> = read(&sample_path())
        .iter()
        .map(|(k, x)| (k.replace('.', "/"), x.shallow_clone()))
        .collect();
    let pocket = given
        .iter()
        .find(|(k, _)| k == "constraint_feature/pocket")
        .map(|(_, x)| x.ones_like())
        .unwrap();
    given.push(("constraint_feature.pocket".into(), pocket));
    let input = dir.path().join("twice.safetensors");
    Tensor::write_safetensors(&given, &input).unwrap();
    let text = std::fs::read_to_string(root().join("examples/protenix.yaml")).unwrap();
    let spec = dir.path().join("protenix_slash.yaml");
    std::fs::write(&spec, format!("{text}\nseparator: /\n")).unwrap();
    let (ok, err) = shard_2x2(&spec, &input, &dir.path().join("s"));
    assert!(
        !ok
            && err.contains("feature `constraint_feature.pocket`: given twice, as `constraint_feature.pocket`, `constraint_feature/pocket`"),
        "{err}"
    );
}

/// `atom_to_token_idx` declared `deliver: one_hot`: each rank gets the one-hot map whose
/// row for an atom has its 1 where the id vector's block says (none for a pad atom),
/// and `assemble` gives the featurizer's id vector back, byte for byte.
#[test]
fn the_id_vector_delivered_as_a_one_hot_names_the_ids_the_id_vector_does() {
    let dir = tempfile::tempdir().unwrap();
    let sample = read(&sample_path());
    let input = sample_path().display().to_string();
    for mesh in ["3x3", "4"] {
        let plain = spec_for(mesh, dir.path(), false);
        let text = std::fs::read_to_string(&plain).unwrap();
        let declared = "index: {of: tokens, scope: shard_local}";
        assert!(text.contains(declared), "the id vector's declaration");
        let one_hot = dir.path().join(format!("one_hot-{mesh}.yaml"));
        let delivered = "index: {of: tokens, scope: shard_local, deliver: one_hot}";
        std::fs::write(&one_hot, text.replacen(declared, delivered, 1)).unwrap();
        let one_hot = one_hot.display().to_string();
        let at = |what: &str| {
            dir.path()
                .join(format!("{mesh}-{what}"))
                .display()
                .to_string()
        };
        for (spec, out) in [(&plain, at("ids")), (&one_hot, at("one_hot"))] {
            run(&[
                "shard",
                spec,
                "--features",
                &input,
                "--mesh",
                mesh,
                "--encoding",
                "dense",
                "--out",
                &out,
            ]);
        }
        let ranks = std::fs::read_dir(at("ids")).unwrap().filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("rank-")
        });
        for rank in 0..ranks.count() {
            let block = |folder: &str| {
                read(&Path::new(&at(folder)).join(format!("rank-{rank}.safetensors")))
                    .remove("atom_to_token_idx")
                    .unwrap()
            };
            let (ids, map) = (ints(&block("ids")), block("one_hot"));
            assert_eq!(map.size()[0] as usize, ids.len(), "{mesh} rank {rank}");
            for (row, &id) in ids.iter().enumerate() {
                let hot = ints(&map.get(row as i64).nonzero().flatten(0, -1));
                let want = if id < 0 { vec![] } else { vec![id] };
                assert_eq!(hot, want, "{mesh} rank {rank} atom {row}");
            }
        }
        let back = at("back.safetensors");
        run(&[
            "assemble",
            &one_hot,
            "--shards",
            &at("one_hot"),
            "--out",
            &back,
        ]);
        let back = read(Path::new(&back));
        let (x, y) = (&sample["atom_to_token_idx"], &back["atom_to_token_idx"]);
        assert_eq!((x.kind(), x.size()), (y.kind(), y.size()), "{mesh}");
        assert!(x.equal(y), "{mesh}: the id vector after the round trip");
    }
}

/// A window of 2^27 atoms with a key halo, under a 3 GB address-space limit: the halo is
/// laid out from the sample's real rows, never a slot per padded position (before: the
/// process aborted allocating 4 GB), and the rank files' size is refused by the growth
/// check, by name, before the first byte.
#[test]
fn a_huge_window_with_a_key_halo_is_refused_never_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("protenix-huge.yaml").display().to_string();
    let text = std::fs::read_to_string(spec_for("2x2", dir.path(), true)).unwrap();
    let text = text.replace("    window: 32", &format!("    window: {}", 1u64 << 27));
    std::fs::write(&spec, text).unwrap();
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -v 3145728 && exec \"$0\" shard {spec} --features {} --mesh 2x2 --out {}",
            sample_path().display(),
            dir.path().join("s").display()
        ))
        .arg(env!("CARGO_BIN_EXE_featshard"));
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("over --max-growth"), "{err}");
    assert!(!dir.path().join("s").exists());
}

/// An owner id vector one longer or shorter than the atoms: told by its own name and
/// length against a feature the sample gave, never against the derived `atom_mask`.
#[test]
fn an_id_vector_of_another_length_is_named_with_its_length() {
    let dir = tempfile::tempdir().unwrap();
    let sample = read(&sample_path());
    let ids = &sample["atom_to_token_idx"];
    let n = ids.size()[0];
    for (len, vector) in [
        (n + 1, Tensor::cat(&[ids, &ids.narrow(0, n - 1, 1)], 0)),
        (n - 1, ids.narrow(0, 0, n - 1)),
    ] {
        let mut given: Vec<(String, Tensor)> = sample
            .iter()
            .map(|(k, x)| (k.clone(), x.shallow_clone()))
            .collect();
        given.retain(|(k, _)| k != "atom_to_token_idx");
        given.push(("atom_to_token_idx".into(), vector));
        let input = dir.path().join(format!("ids-{len}.safetensors"));
        Tensor::write_safetensors(&given, &input).unwrap();
        let (ok, err) = shard_2x2(
            &root().join("examples/protenix.yaml"),
            &input,
            &dir.path().join(format!("s{len}")),
        );
        assert!(
            !ok
                && err.contains(&format!(
                    "feature `atom_to_token_idx`, axis 0 (atoms): length {len}, but feature `atom_to_tokatom_idx` has atoms length {n}"
                )),
            "{err}"
        );
    }
}

/// `atom_mask` (derived: `{valid: true}`) given by the sample too: taken when its values
/// are the rule's (before: every 1-D mask was refused, right or not), refused naming
/// the rule when one item is off.
#[test]
fn a_given_validity_mask_is_compared_by_value() {
    let dir = tempfile::tempdir().unwrap();
    let sample = read(&sample_path());
    let atoms = sample["ref_pos"].size()[0];
    let ones = Tensor::ones([atoms], (Kind::Bool, tch::Device::Cpu));
    for (name, mask, want) in [
        ("right", ones.shallow_clone(), true),
        (
            "wrong",
            ones.index_fill(0, &Tensor::from_slice(&[3i64]), 0),
            false,
        ),
    ] {
        let mut given: Vec<(String, Tensor)> = sample
            .iter()
            .map(|(k, x)| (k.clone(), x.shallow_clone()))
            .collect();
        given.push(("atom_mask".into(), mask));
        let input = dir.path().join(format!("{name}.safetensors"));
        Tensor::write_safetensors(&given, &input).unwrap();
        let (ok, err) = shard_2x2(
            &root().join("examples/protenix.yaml"),
            &input,
            &dir.path().join(name),
        );
        assert_eq!(ok, want, "{name}: {err}");
        if !ok {
            assert!(
                err.contains(
                    "feature `atom_mask`: the sample's value differs from a validity mask"
                ),
                "{err}"
            );
        }
    }
}

/// A sample lacking several features is told of every one at once (before: the first
/// only), by name and count.
#[test]
fn every_missing_feature_is_named_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let gone = ["asym_id", "ref_charge", "sym_id"];
    let given: Vec<(String, Tensor)> = read(&sample_path())
        .into_iter()
        .filter(|(k, _)| !gone.contains(&k.as_str()))
        .collect();
    let input = dir.path().join("lacking.safetensors");
    Tensor::write_safetensors(&given, &input).unwrap();
    let (ok, err) = shard_2x2(
        &root().join("examples/protenix.yaml"),
        &input,
        &dir.path().join("s"),
    );
    assert!(
        !ok && err
            .contains("3 features missing from the sample: `asym_id`, `ref_charge`, `sym_id`"),
        "{err}"
    );
}
