//! Hostile input against the compact surfaces, fourth round: sizes a file declares
//! (a sparse feature's element count, a map's width, a compact folder's dense form) are
//! bounded before anything is allocated from them, and values a compact form could not
//! carry back are refused on intake. Each case runs the built binary and requires a
//! refusal by name (exit 1), never an abort.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod support;

use support::cli::{root, within};

/// One tensor of a hand-written safetensors file: its bytes, or `None` for a tensor
/// of zeros left as a hole in the file (any size, nothing on disk).
struct T<'a> {
    name: &'a str,
    dtype: &'a str,
    shape: Vec<u64>,
    data: Option<Vec<u8>>,
}

fn t<'a>(name: &'a str, dtype: &'a str, shape: &[u64], data: Option<Vec<u8>>) -> T<'a> {
    T {
        name,
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

fn elem(dtype: &str) -> u64 {
    match dtype {
        "BOOL" | "U8" | "I8" => 1,
        "I16" | "F16" => 2,
        "I32" | "F32" => 4,
        _ => 8,
    }
}

/// A safetensors file of `tensors`, the holes last so that they stay holes.
fn write_file(path: &Path, tensors: &[T]) {
    use std::io::Write;
    let mut order: Vec<&T> = tensors.iter().filter(|t| t.data.is_some()).collect();
    order.extend(tensors.iter().filter(|t| t.data.is_none()));
    let (mut header, mut at) = (serde_json::Map::new(), 0u64);
    for t in &order {
        let n = t.shape.iter().product::<u64>() * elem(t.dtype);
        header.insert(
            t.name.to_owned(),
            serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [at, at + n]}),
        );
        at += n;
    }
    let mut text = serde_json::to_vec(&header).unwrap();
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(text.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&text).unwrap();
    for t in order.iter().filter_map(|t| t.data.as_ref()) {
        f.write_all(t).unwrap();
    }
    f.set_len(8 + text.len() as u64 + at).unwrap();
}

fn f32s(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn i64s(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A spec of one sharded semantic `tokens`, its mask, and `features` (YAML lines).
fn spec(dir: &Path, features: &str) -> PathBuf {
    let text = format!(
        "version: 1\nmodule: hostile\nmesh: {{cp: [cp0, cp1]}}\nsemantics:\n  tokens: {{shard: true}}\nfeatures:\n  mask: {{axes: [tokens], dtype: float32, mask: tokens}}\n{features}"
    );
    let path = dir.join("spec.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// [`spec`] with `atoms` owned by tokens through the one-hot map `atom_to_token`.
fn spec_with_atoms(dir: &Path) -> PathBuf {
    let path = spec(
        dir,
        "  atom_to_token:\n    axes: [atoms, tokens]\n    dtype: int64\n    coshard: [{axis: 1, follows: 0}]\n    index: {of: tokens, scope: shard_local, one_hot: 1}\n",
    );
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "  tokens: {shard: true}\n",
        "  tokens: {shard: true}\n  atoms: {shard: true, owner: tokens, map: atom_to_token}\n",
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `featshard ARGS` run from the repository root, failing the test past `secs`.
fn run(secs: u64, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_featshard"));
    cmd.args(args).current_dir(root());
    within(secs, cmd)
}

fn shard(spec: &Path, input: &Path, out: &Path) -> Output {
    run(
        120,
        &[
            "shard",
            &spec.display().to_string(),
            "--features",
            &input.display().to_string(),
            "--mesh",
            "1x1",
            "--out",
            &out.display().to_string(),
        ],
    )
}

/// Exit 1 (not an abort's 134, a signal or a panic) with every needle in stderr.
fn refused(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "expected exit 1, got: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const BONDS: &str = "  bonds: {axes: [tokens, tokens, 1], dtype: float32, sparse: true}\n";

/// 1. A sparse feature whose elements declare 2^31 of them (a hole file): refused by
///    the element limit before a byte is reserved for them (before: 48 GB reserved,
///    and an abort).
#[test]
fn a_sparse_feature_declaring_billions_of_elements_is_refused_by_its_count() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), BONDS);
    let input = dir.path().join("huge.safetensors");
    let n = 1u64 << 31;
    write_file(
        &input,
        &[
            t("mask", "F32", &[4], Some(f32s(&[1.0; 4]))),
            t("bonds.indices", "I8", &[3, n], None),
            t("bonds.values", "F32", &[n], None),
        ],
    );
    refused(
        &shard(&spec, &input, &dir.path().join("out")),
        &[
            "feature `bonds`",
            "given as 2147483648 elements, more than the limit of 134217728",
        ],
    );
}

/// 2. A one-hot map given as 4 indices, as wide as a 2^31-long feature says its
///    items are: the length limit is checked before anything is made that wide.
#[test]
fn a_map_given_as_indices_as_wide_as_a_huge_feature_is_refused_by_the_length_limit() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec_with_atoms(dir.path());
    let input = dir.path().join("wide.safetensors");
    write_file(
        &input,
        &[
            t("atom_to_token", "I64", &[4], Some(i64s(&[0, 0, 1, 1]))),
            t("mask", "U8", &[1 << 31], None),
        ],
    );
    refused(
        &shard(&spec, &input, &dir.path().join("out")),
        &[
            "feature `mask`",
            "axis 0 (tokens)",
            "length 2147483648 is more than the limit of 134217728",
        ],
    );
}

/// 3. A compact folder whose dense form is terabytes (a sparse pair feature at 2^20
///    tokens; a one-hot feature of 2^40 classes): `assemble` refuses it by its size
///    before expanding a block (before: an abort allocating), naming the feature.
#[test]
fn assembling_a_tiny_compact_folder_of_terabytes_is_refused_by_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            BONDS,
            1u64 << 20,
            "bonds",
            vec![
                t("bonds.indices", "I64", &[3, 1], Some(i64s(&[3, 5, 0]))),
                t("bonds.values", "F32", &[1], Some(f32s(&[1.0]))),
            ],
        ),
        (
            "  kind: {axes: [tokens, 1099511627776], dtype: float32, one_hot: 1}\n",
            4,
            "kind",
            vec![t("kind", "I64", &[4], Some(i64s(&[0, 5, -1, 1 << 39])))],
        ),
    ];
    for (k, (feature_yaml, tokens, name, mut tensors)) in cases.into_iter().enumerate() {
        let case = dir.path().join(format!("case{k}"));
        std::fs::create_dir(&case).unwrap();
        let spec = spec(&case, feature_yaml);
        let input = case.join("sample.safetensors");
        tensors.push(t("mask", "BOOL", &[tokens], Some(vec![1; tokens as usize])));
        write_file(&input, &tensors);
        let shards = case.join("shards");
        ok(&shard(&spec, &input, &shards));
        let out = case.join("back.safetensors");
        let back = run(
            120,
            &[
                "assemble",
                &spec.display().to_string(),
                "--shards",
                &shards.display().to_string(),
                "--out",
                &out.display().to_string(),
            ],
        );
        refused(
            &back,
            &[
                "assembling would hold",
                &format!("(feature `{name}` alone"),
                "more than this machine's",
            ],
        );
        assert!(!out.exists());
    }
}

/// 7. A `bool` feature declared sparse holding byte 2, given dense or as elements: it
///    could not come back as written, so `shard` refuses it on intake (before: exit 0,
///    then its own `assemble` called the rank files corrupt).
#[test]
fn a_sparse_bool_feature_holding_byte_2_is_refused_on_intake() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(
        dir.path(),
        "  flags: {axes: [tokens, tokens], dtype: bool, sparse: true}\n",
    );
    let mask = || t("mask", "F32", &[3], Some(f32s(&[1.0; 3])));
    let dense = dir.path().join("dense.safetensors");
    let mut flags = vec![0u8; 9];
    flags[4] = 2;
    write_file(&dense, &[mask(), t("flags", "BOOL", &[3, 3], Some(flags))]);
    let out = shard(&spec, &dense, &dir.path().join("a"));
    refused(&out, &["feature `flags`", "found byte 2 at flat index 4"]);
    let pairs = dir.path().join("pairs.safetensors");
    write_file(
        &pairs,
        &[
            mask(),
            t("flags.indices", "I64", &[2, 1], Some(i64s(&[1, 1]))),
            t("flags.values", "BOOL", &[1], Some(vec![2])),
        ],
    );
    refused(
        &shard(&spec, &pairs, &dir.path().join("b")),
        &[
            "feature `flags`",
            "element 0: a bool holds byte 0 (false) or 1 (true), given byte 2",
        ],
    );
}

/// 8. A sparse element whose flat position would pass 2^64: its dense form's element
///    count is refused before any position is computed (before: the position wrapped
///    to 5 and the element was stored there).
#[test]
fn a_sparse_feature_whose_dense_form_overflows_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(
        dir.path(),
        "  wide: {axes: [tokens, 2147483648, 2147483648], dtype: float32, sparse: true}\n",
    );
    let input = dir.path().join("wide.safetensors");
    write_file(
        &input,
        &[
            t("mask", "F32", &[4], Some(f32s(&[1.0; 4]))),
            t("wide.indices", "I64", &[3, 1], Some(i64s(&[1, 0, 5]))),
            t("wide.values", "F32", &[1], Some(f32s(&[1.0]))),
        ],
    );
    refused(
        &shard(&spec, &input, &dir.path().join("out")),
        &[
            "feature `wide`",
            "its dense shape [4, 2147483648, 2147483648] has more than 9223372036854775807 elements",
        ],
    );
}

/// 9. `explain`'s byte counts past 2^64 are shown as large, not wrapped to a small
///    count (before: `0 B`, and compact larger than dense).
#[test]
fn explain_byte_counts_do_not_wrap() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(
        dir.path(),
        "  big: {axes: [tokens, 4611686018427387904], dtype: int64}\n",
    );
    let out = run(
        60,
        &[
            "explain",
            &spec.display().to_string(),
            "--mesh",
            "1x1",
            "--lengths",
            "tokens=1024",
        ],
    );
    ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    // `big` alone: 1024 rows of 2^62 int64.
    let big = 1024u128 * (1u128 << 62) * 8;
    let line = text
        .lines()
        .find(|l| l.starts_with("bytes per sample"))
        .unwrap_or_else(|| panic!("no bytes line in {text}"));
    let dense: f64 = line
        .split("dense ")
        .nth(1)
        .and_then(|r| r.split(" B").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no dense count in {line}"));
    assert!(dense >= 0.99 * big as f64, "{line}");
    assert!(line.contains("(1.0x smaller"), "{line}");
}

/// The real `prot60_smiles` sample's tensors (name, safetensors dtype, shape, bytes),
/// `edit`ed, written to `path` with its header metadata.
fn real_edited(path: &Path, edit: impl FnOnce(&mut Vec<(String, String, Vec<u64>, Vec<u8>)>)) {
    use safetensors::SafeTensors;
    let bytes = std::fs::read(root().join("tests/data/real/prot60_smiles.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, String, Vec<u64>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            let dtype = format!("{:?}", t.dtype());
            let shape = t.shape().iter().map(|&d| d as u64).collect();
            (n, dtype, shape, t.data().to_vec())
        })
        .collect();
    edit(&mut tensors);
    let list: Vec<T> = tensors
        .iter()
        .map(|(n, d, s, b)| t(n, d, s, Some(b.clone())))
        .collect();
    write_file(path, &list);
}

fn shard_real(input: &Path, out: &Path, extra: &[&str]) -> Output {
    let spec = support::cli::spec();
    let mut args = vec![
        "shard",
        spec.as_str(),
        "--workflow",
        "inference",
        "--mesh",
        "2x2",
    ];
    let (input, out) = (input.display().to_string(), out.display().to_string());
    args.extend(["--features", &input, "--out", &out]);
    args.extend(extra);
    run(120, &args)
}

/// 13. A sparse feature's element keys passed through are the feature, not a key the
///     sample lacks (before: "missing from the sample", though it was there).
#[test]
fn passing_through_a_sparse_feature_s_elements_says_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("pairs.safetensors");
    real_edited(&input, |ts| {
        let k = ts.iter().position(|x| x.0 == "token_bonds").unwrap();
        let (_, _, shape, bytes) = ts.remove(k);
        let nonzero: Vec<usize> = bytes
            .chunks(4)
            .enumerate()
            .filter(|(_, v)| v.iter().any(|&b| b != 0))
            .map(|(i, _)| i)
            .collect();
        let n = shape[1] as usize;
        let mut coords = Vec::new();
        for d in 0..3 {
            for &i in &nonzero {
                coords.push([i / n, i % n, 0][d] as i64);
            }
        }
        let values: Vec<u8> = nonzero
            .iter()
            .flat_map(|&i| bytes[i * 4..i * 4 + 4].to_vec())
            .collect();
        let count = nonzero.len() as u64;
        ts.push((
            "token_bonds.indices".into(),
            "I64".into(),
            vec![3, count],
            i64s(&coords),
        ));
        ts.push((
            "token_bonds.values".into(),
            "F32".into(),
            vec![count],
            values,
        ));
    });
    ok(&shard_real(&input, &dir.path().join("a"), &[]));
    let passed = shard_real(
        &input,
        &dir.path().join("b"),
        &["--passthrough", "token_bonds.indices"],
    );
    refused(
        &passed,
        &[
            "feature `token_bonds`",
            "`token_bonds.indices` is this sparse feature given as its elements: it is placed, not passed through",
        ],
    );
}

/// 14. One-hot indices or map rows given as floats are refused as indices that must be
///     integers, with the dtype and shape as given (before: "expected 2 axes", and a
///     map's shape after the incoming pads were cut); an index past 2^53 is printed as
///     given, not rounded through a float.
#[test]
fn indices_given_as_floats_or_past_2_53_are_named_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("float.safetensors");
    real_edited(&input, |ts| {
        let k = ts.iter().position(|x| x.0 == "atom_to_token").unwrap();
        let shape = ts[k].2.clone();
        ts[k] = (
            "atom_to_token".into(),
            "F32".into(),
            vec![shape[0]],
            f32s(&vec![0.0; shape[0] as usize]),
        );
    });
    let floats = shard_real(&input, &dir.path().join("a"), &[]);
    refused(
        &floats,
        &[
            "feature `atom_to_token`, axis 1 (one-hot)",
            "given as indices (its one-hot axis left out), which are integers; given float32 [512]",
        ],
    );
    let input = dir.path().join("far.safetensors");
    real_edited(&input, |ts| {
        let k = ts.iter().position(|x| x.0 == "atom_to_token").unwrap();
        let n = ts[k].2[0] as usize;
        let mut rows = vec![0i64; n];
        rows[3] = (1 << 53) + 1;
        ts[k] = (
            "atom_to_token".into(),
            "I64".into(),
            vec![n as u64],
            i64s(&rows),
        );
    });
    let far = shard_real(&input, &dir.path().join("b"), &[]);
    refused(
        &far,
        &["given as indices, 9007199254740993 names no item of the 73 `tokens` (-1: none) at [3]"],
    );
}

/// 15. A corrupt stored block names its rank file as well as its feature.
#[test]
fn a_corrupt_stored_block_names_its_rank_file() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    let input = root().join("tests/data/real/prot60_smiles.safetensors");
    ok(&shard_real(&input, &shards, &[]));
    support::cli::corrupt_first_byte(&shards.join("rank-2.safetensors"), "res_type", 200);
    let out = dir.path().join("back.safetensors");
    let spec = support::cli::spec();
    let (shards, out) = (shards.display().to_string(), out.display().to_string());
    let args = [
        "assemble",
        &spec,
        "--shards",
        &shards,
        "--out",
        &out,
        "--no-verify",
    ];
    let back = run(120, &args);
    refused(
        &back,
        &["rank-2.safetensors: feature `res_type`: a stored index 200 names no class of 33"],
    );
}

/// 17. An `--out` whose folders do not exist yet has them made (as `generate` does).
#[test]
fn an_out_in_folders_not_made_yet_has_them_made() {
    let dir = tempfile::tempdir().unwrap();
    let input = root().join("tests/data/real/prot60_nomsa.safetensors");
    let shards = dir.path().join("a/b/c");
    ok(&shard_real(&input, &shards, &[]));
    assert!(shards.join("manifest.json").is_file());
    let back = dir.path().join("x/y/back.safetensors");
    let spec = support::cli::spec();
    ok(&run(
        120,
        &[
            "assemble",
            &spec,
            "--shards",
            &shards.display().to_string(),
            "--out",
            &back.display().to_string(),
        ],
    ));
    assert!(back.is_file());
}
