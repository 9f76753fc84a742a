//! `featshard validate SPEC --features SAMPLE`: a census of wrong specs, each a shipped
//! example with one declaration planted wrong (as a new user misreads a featurizer),
//! checked against the real sample it is for. Every one is flagged, naming the feature
//! and what its values show; every shipped example with its samples has no finding.

mod support;

use std::path::PathBuf;

use support::cli::{featshard, root};

/// The examples' real samples, and the workflow they are of.
const BOLTZ: [&str; 2] = ["real/prot60_nomsa", "real/prot60_smiles"];

fn data(name: &str) -> String {
    let path = root().join("tests/data").join(name);
    format!("{}.safetensors", path.display())
}

/// `featshard validate SPEC --features SAMPLE [--workflow W]`: exit code and stdout.
fn validate(spec: &str, sample: &str, workflow: Option<&str>) -> (i32, String) {
    let mut args = vec!["validate", spec, "--features", sample];
    if let Some(w) = workflow {
        args.extend(["--workflow", w]);
    }
    let out = featshard(&args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The shipped example, with OpenFold3's collated form's `[1]` settings as scalars.
fn example(name: &str, collated: bool) -> String {
    let text = std::fs::read_to_string(root().join(format!("examples/{name}.yaml"))).unwrap();
    match collated {
        true => text.replace("axes: [1]", "axes: []"),
        false => text,
    }
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path: PathBuf = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// One planted mistake: the example, its sample, each text replaced (it must be there),
/// the feature the finding names and words it says.
struct Plant {
    example: &'static str,
    sample: &'static str,
    replace: &'static [(&'static str, &'static str)],
    feature: &'static str,
    says: &'static str,
}

const fn plant(
    example: &'static str,
    sample: &'static str,
    replace: &'static [(&'static str, &'static str)],
    feature: &'static str,
    says: &'static str,
) -> Plant {
    Plant {
        example,
        sample,
        replace,
        feature,
        says,
    }
}

const START_AS_DATA: &[(&str, &str)] = &[(
    "    index: {of: atoms, scope: padded_global}\n    doc: each token's first atom",
    "    doc: each token's first atom",
)];
const OWNER_IDS_AS_DATA: &[(&str, &str)] = &[
    (
        "    map: atom_to_token_index               # a token id per atom\n",
        "",
    ),
    (
        "    incoming_pads: {mask: atom_mask, map_pad: 0}",
        "    incoming_pads: {mask: atom_mask}",
    ),
    (
        "    index: {of: tokens, scope: shard_local}\n    doc: each atom's token;",
        "    doc: each atom's token;",
    ),
];
const TOKEN_MASK_AS_DATA: &[(&str, &str)] = &[
    (
        "    incoming_pads: {mask: token_mask}      # padded to a token budget with 0s\n",
        "",
    ),
    (
        "dtype: float32, mask: tokens, doc: \"1 on real tokens",
        "dtype: float32, doc: \"1 on real tokens",
    ),
];
const NO_TOKEN_PADS: &[(&str, &str)] = &[(
    "    incoming_pads: {mask: token_mask}      # padded to a token budget with 0s\n",
    "",
)];
const NO_MAP_PAD: &[(&str, &str)] = &[(
    "incoming_pads: {mask: atom_mask, map_pad: 0}",
    "incoming_pads: {mask: atom_mask}",
)];

/// At least 20 mistakes of every kind the check knows, over the three featurizers.
fn census() -> Vec<Plant> {
    vec![
        // Ids of another semantic's items declared plain data.
        plant("openfold3", "openfold3/plain", START_AS_DATA, "start_atom_index", "each `tokens` item's first `atoms` item"),
        plant("openfold3", "openfold3/padded", START_AS_DATA, "start_atom_index", "each `tokens` item's first `atoms` item"),
        plant("openfold3", "openfold3/collated", START_AS_DATA, "start_atom_index", "each `tokens` item's first `atoms` item"),
        plant("openfold3", "openfold3/plain", OWNER_IDS_AS_DATA, "atom_to_token_index", "a `tokens` id per `atoms` item"),
        plant("openfold3", "openfold3/padded", OWNER_IDS_AS_DATA, "atom_to_token_index", "a `tokens` id per `atoms` item"),
        plant("protenix", "protenix/small_complex", &[("    pad: -1\n    index: {of: atoms, scope: padded_global, none: -1}\n", "")], "frame_atom_index", "ids of `atoms` of the row's own `tokens` item (-1: none)"),
        // A pad mask declared plain data, or pads kept as items.
        plant("openfold3", "openfold3/padded", TOKEN_MASK_AS_DATA, "token_mask", "1 on the first 72 `tokens` and 0 on the 8 after"),
        plant("openfold3", "openfold3/padded", NO_TOKEN_PADS, "token_mask", "consider `incoming_pads: {mask: token_mask}` on `tokens`"),
        plant("boltz2", BOLTZ[0], &[("    incoming_pads: {mask: atom_pad_mask}    # padded to a multiple of the 32-atom window\n", "")], "atom_pad_mask", "1 on the first 468 `atoms` and 0 on the 12 after"),
        // A flag of some real items declared a mask.
        plant("openfold3", "openfold3/plain", &[("  is_protein: {axes: [tokens], dtype: int32,", "  is_protein: {axes: [tokens], dtype: int32, mask: tokens,")], "is_protein", "a flag of some real items"),
        plant("openfold3", "openfold3/padded", &[("  pocket_sampling_ligand_atom_mask: {axes: [atoms], dtype: float32,", "  pocket_sampling_ligand_atom_mask: {axes: [atoms], dtype: float32, mask: atoms,")], "pocket_sampling_ligand_atom_mask", "a flag of some real items"),
        plant("protenix", "protenix/small_complex", &[("  is_ligand: {axes: [atoms], dtype: int64}", "  is_ligand: {axes: [atoms], dtype: int64, mask: atoms}")], "is_ligand", "a flag of some real items"),
        // One-hot encodings declared dense.
        plant("openfold3", "openfold3/plain", &[("  restype: {axes: [tokens, 32], dtype: int32, one_hot: 1}", "  restype: {axes: [tokens, 32], dtype: int32}")], "restype", "`one_hot: 1`"),
        plant("openfold3", "openfold3/collated", &[("  msa: {axes: [msa, tokens, 32], dtype: int32, one_hot: 2}", "  msa: {axes: [msa, tokens, 32], dtype: int32}")], "msa", "`one_hot: 2`"),
        plant("openfold3", "openfold3/padded", &[("  ref_element: {axes: [atoms, 119], dtype: int32, one_hot: 1}", "  ref_element: {axes: [atoms, 119], dtype: int32}")], "ref_element", "a one-hot encoding over 119 classes"),
        // Its key halo is one-hot as it is: both planted dense.
        plant("protenix", "protenix/small_complex", &[("  ref_atom_name_chars: {axes: [atoms, 4, 64], dtype: int64, one_hot: 2}", "  ref_atom_name_chars: {axes: [atoms, 4, 64], dtype: int64}"), ("dtype: int64, one_hot: 2, derive: {halo: {of: ref_atom_name_chars", "dtype: int64, derive: {halo: {of: ref_atom_name_chars")], "ref_atom_name_chars", "`one_hot: 2`"),
        plant("boltz2", BOLTZ[1], &[("  res_type: {axes: [tokens, 33], dtype: int64, one_hot: 1,", "  res_type: {axes: [tokens, 33], dtype: int64,")], "res_type", "`one_hot: 1`"),
        plant("boltz2", BOLTZ[0], &[("  ref_element: {axes: [atoms, 128], dtype: int64, one_hot: 1}", "  ref_element: {axes: [atoms, 128], dtype: int64}")], "ref_element", "over 128 classes"),
        // Mostly-zero pair features declared dense.
        plant("openfold3", "openfold3/plain", &[("  token_bonds: {axes: [tokens, tokens], dtype: int32, sparse: true}", "  token_bonds: {axes: [tokens, tokens], dtype: int32}")], "token_bonds", "`sparse: true`"),
        plant("protenix", "protenix/small_complex", &[("  bond_mask: {axes: [atoms, atoms], dtype: int64, sparse: true}", "  bond_mask: {axes: [atoms, atoms], dtype: int64}")], "bond_mask", "a mostly-zero pair feature"),
        plant("boltz2", BOLTZ[1], &[("  type_bonds: {axes: [tokens, tokens], dtype: int64, sparse: true}", "  type_bonds: {axes: [tokens, tokens], dtype: int64}")], "type_bonds", "`sparse: true`"),
        // Index values outside the items, no `none`.
        plant("protenix", "protenix/small_complex", &[("index: {of: atoms, scope: padded_global, none: -1}", "index: {of: atoms, scope: padded_global}")], "frame_atom_index", "consider `none: -1`"),
        // A map whose pads name a real owner.
        plant("openfold3", "openfold3/collated", NO_MAP_PAD, "atom_to_token_index", "consider `incoming_pads: {mask: atom_mask, map_pad: 0}` on `atoms`"),
    ]
}

#[test]
fn every_planted_mistake_is_flagged_by_feature_and_what_its_values_show() {
    let dir = tempfile::tempdir().unwrap();
    let cases = census();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for (k, c) in cases.iter().enumerate() {
        let collated = c.sample.ends_with("collated");
        let mut text = example(c.example, collated);
        for (from, to) in c.replace {
            assert!(
                text.contains(from),
                "case {k}: `{from}` is not in {}",
                c.example
            );
            text = text.replacen(from, to, 1);
        }
        let spec = write(dir.path(), &format!("case{k}"), &text);
        let workflow = (c.example == "boltz2").then_some("inference");
        let (code, out) = validate(&spec, &data(c.sample), workflow);
        let line = out
            .lines()
            .find(|l| l.contains(&format!(": feature `{}`: ", c.feature)) && l.contains(c.says));
        assert!(
            code == 1 && line.is_some_and(|l| l.starts_with(&format!("  {spec}:"))),
            "case {k} ({} on {}): not flagged as `{}` saying `{}`:\n{out}",
            c.example,
            c.sample,
            c.feature,
            c.says
        );
    }
}

#[test]
fn the_shipped_examples_and_their_samples_have_no_findings() {
    let dir = tempfile::tempdir().unwrap();
    let mut runs: Vec<(String, String, Option<&str>)> = Vec::new();
    for form in ["plain", "padded", "collated"] {
        let name = format!("openfold3-{form}");
        let spec = write(dir.path(), &name, &example("openfold3", form == "collated"));
        runs.push((spec, data(&format!("openfold3/{form}")), None));
    }
    let protenix = root().join("examples/protenix.yaml").display().to_string();
    runs.push((protenix, data("protenix/small_complex"), None));
    for sample in BOLTZ {
        let boltz = root().join("examples/boltz2.yaml").display().to_string();
        runs.push((boltz.clone(), data(sample), Some("inference")));
        let cp = sample.replace("real/", "real/boltz_cp/");
        runs.push((boltz, data(&cp), Some("inference")));
    }
    for (spec, sample, workflow) in &runs {
        let (code, out) = validate(spec, sample, *workflow);
        assert!(
            code == 0 && out.contains(": no findings; taken"),
            "{spec} on {sample}:\n{out}"
        );
    }
}

/// Values a hostile sample may hold (a count of 2^31 - 1, an owner id of 2^31 - 1) are
/// read without allocating by them: the check names the id, the sample is refused by
/// name, exit 1, no abort.
#[test]
fn hostile_values_are_findings_and_refusals_never_an_abort() {
    use safetensors::tensor::TensorView;

    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(data("openfold3/plain")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(k, v)| (k, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    for (k, _, _, data) in owned.iter_mut() {
        let at = match k.as_str() {
            "num_atoms_per_token" => 0,
            "atom_to_token_index" => 5,
            _ => continue,
        };
        data[4 * at..4 * at + 4].copy_from_slice(&i32::MAX.to_le_bytes());
    }
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(k, d, s, b)| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let path = dir.path().join("hostile.safetensors");
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let spec = root().join("examples/openfold3.yaml").display().to_string();
    let (code, out) = validate(&spec, &path.display().to_string(), None);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "feature `atom_to_token_index`: 1 of its values name no item of the 72 `tokens`"
        ) && out.contains("refused: feature `num_atoms_per_token`"),
        "{out}"
    );
}
