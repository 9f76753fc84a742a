//! What the values of one sample suggest: every axis' semantic (or a question), and the
//! rules a featurizer's output needs (incoming pads, owners, lists, derived features).

use std::collections::BTreeMap;

use super::read::{Anchor, Sample, Tensor};
use crate::values::shows;

/// A semantic of the draft: anchored, or a list with a length of its own.
pub struct SemanticDraft {
    pub name: String,
    pub sharded: bool,
    /// `key: value` entries after `shard`, e.g. `owner: tokens`.
    pub keys: Vec<String>,
    /// `# proposed:` when `keys` came from the values; else a plain note.
    pub proposed: bool,
    pub note: String,
}

#[derive(Default)]
pub struct FeatureDraft {
    /// Each axis: a semantic, a channel size or `QUESTION(a|b)`.
    pub axes: Vec<String>,
    /// `key: value` entries after `dtype`.
    pub keys: Vec<String>,
    /// `# QUESTION` and `# proposed:` comment lines.
    pub notes: Vec<String>,
}

pub struct Proposals {
    pub semantics: Vec<SemanticDraft>,
    pub features: BTreeMap<String, FeatureDraft>,
    /// Features the sample lacks that the pipeline can make (validity masks), each as
    /// its `# proposed:` note and its YAML line.
    pub derived: Vec<(String, String)>,
}

/// Every proposal for one sample.
pub fn everything(sample: &Sample, lengths: &[Anchor]) -> Proposals {
    let lists = lists(sample, lengths);
    let mut features = axes(sample, lengths, &lists);
    let mut semantics: Vec<SemanticDraft> = lengths
        .iter()
        .map(|a| SemanticDraft {
            name: a.semantic.to_owned(),
            sharded: a.sharded,
            // A one-axis model keeps MSA rows whole and splits their tokens.
            keys: match a.semantic {
                "msa" => vec!["on_1d: whole".to_owned()],
                _ => Vec::new(),
            },
            proposed: false,
            note: format!("length {} (axis 0 of {})", a.len, a.key),
        })
        .collect();
    let real = incoming(sample, lengths, &mut semantics, &mut features);
    own_masks(sample, &mut features);
    owners(sample, lengths, &real, &mut semantics, &mut features);
    one_hot_maps(sample, &mut features);
    one_hot_channels(sample, &mut features);
    sparse_pairs(sample, &mut features);
    list_roles(
        sample,
        lengths,
        &lists,
        &real,
        &mut semantics,
        &mut features,
    );
    derived(sample, &mut features);
    class_ids(sample, &mut features);
    if let Some(owners) = id_vectors(sample, lengths, &features)
        .first()
        .and_then(|m| sample.tensors[m].values.as_deref())
    {
        atom_indexes(
            sample,
            lengths,
            &shows::owners_of_ids(owners),
            &mut features,
        );
    }
    let derived = validity_masks(sample, &semantics, &features);
    Proposals {
        semantics,
        features,
        derived,
    }
}

/// Masks of the real tokens and atoms, and of token pairs, made by the pipeline where
/// the sample has no mask of them (the AlphaFold3 family's Protenix emits none): a
/// model masks its pads by them.
fn validity_masks(
    sample: &Sample,
    semantics: &[SemanticDraft],
    features: &BTreeMap<String, FeatureDraft>,
) -> Vec<(String, String)> {
    let masked = |s: &str| {
        features
            .values()
            .any(|f| f.keys.iter().any(|k| k == &format!("mask: {s}")))
    };
    let free = |name: &str| {
        !sample.tensors.contains_key(name) && !sample.metadata.iter().any(|m| m == name)
    };
    let mut out = Vec::new();
    for (semantic, name) in [("tokens", "token_mask"), ("atoms", "atom_mask")] {
        let drafted = semantics.iter().any(|s| s.name == semantic && s.sharded);
        if !drafted || masked(semantic) || !free(name) {
            continue;
        }
        out.push((
            format!("# proposed: the sample has no mask of its real {semantic}: the pipeline makes {name} (1 on every real item, 0 at pads)"),
            format!("{name}: {{axes: [{semantic}], dtype: bool, mask: {semantic}, derive: {{valid: true}}}}"),
        ));
        if semantic == "tokens" && free("pair_mask") {
            out.push((
                "# proposed: and pair_mask, of the real token pairs".to_owned(),
                "pair_mask: {axes: [tokens, tokens], dtype: bool, mask: tokens, derive: {valid: true}}".to_owned(),
            ));
        }
    }
    out
}

/// A list of ids with a length of its own: `NAME_index` of shape `[c, K]`.
struct List {
    semantic: String,
    len: usize,
    /// The features on it and the axis that is the list.
    members: Vec<(String, usize)>,
}

/// `*_index` integer tensors `[c, K]` (c <= 8) start a list each; a 1-D tensor whose
/// name starts with the same word and that has the same length joins it when exactly
/// one list fits.
fn lists(sample: &Sample, lengths: &[Anchor]) -> Vec<List> {
    let mut out: Vec<List> = Vec::new();
    for (name, t) in &sample.tensors {
        let Some(stem) = name.strip_suffix("_index") else {
            continue;
        };
        let anchored = lengths.iter().any(|a| &a.key == name);
        if let ([c, k], false) = (t.shape.as_slice(), anchored) {
            if *c <= 8 && t.is_integer() {
                out.push(List {
                    semantic: stem.to_owned(),
                    len: *k,
                    members: vec![(name.clone(), 1)],
                });
            }
        }
    }
    let first_word = |s: &str| s.split('_').next().unwrap_or(s).to_owned();
    for (name, t) in &sample.tensors {
        let [k] = t.shape.as_slice() else { continue };
        let fits: Vec<usize> = (0..out.len())
            .filter(|&i| out[i].len == *k && first_word(&out[i].semantic) == first_word(name))
            .collect();
        if let [i] = fits.as_slice() {
            out[*i].members.push((name.clone(), 0));
        }
    }
    out
}

fn axes(sample: &Sample, lengths: &[Anchor], lists: &[List]) -> BTreeMap<String, FeatureDraft> {
    let mut out = BTreeMap::new();
    for (name, t) in &sample.tensors {
        let mut draft = FeatureDraft::default();
        for (d, &n) in t.shape.iter().enumerate() {
            let list = lists
                .iter()
                .find(|l| l.members.iter().any(|(m, a)| m == name && *a == d));
            // The first axis of a list's `[c, K]` ids is a channel (c ids per entry).
            let starts_list = lists
                .iter()
                .any(|l| l.members.first().is_some_and(|(m, _)| m == name));
            if starts_list && d == 0 {
                draft.axes.push(n.to_string());
                continue;
            }
            let anchored = lengths.iter().find(|a| &a.key == name && d == 0);
            // After an axis of a semantic, only a pair's second axis is one too
            // (`[tokens, tokens]`, `[atoms, atoms]`): a size there that equals the
            // templates' or the MSA's is a channel (`[atoms, 4, 64]`). A length of 1
            // names a semantic only before another axis (`[msa, tokens]`, never `[1]`).
            let after_semantic = draft.axes.iter().any(|a| a.parse::<usize>().is_err());
            let matches: Vec<&str> = lengths
                .iter()
                .filter(|a| a.len == n)
                .filter(|a| !after_semantic || PAIRED.contains(&a.semantic))
                .filter(|_| n != 1 || d + 1 < t.shape.len())
                .map(|a| a.semantic)
                .collect();
            draft.axes.push(match (list, anchored, matches.as_slice()) {
                (Some(l), _, _) => l.semantic.clone(),
                (None, Some(a), _) => a.semantic.to_owned(),
                (None, None, []) => n.to_string(),
                (None, None, [one]) => (*one).to_owned(),
                (None, None, many) => {
                    draft.notes.push(format!(
                        "# QUESTION {name}: axis {d} has length {n}, which is the length of {}: which is it?",
                        many.join(" and ")
                    ));
                    format!("QUESTION({})", many.join("|"))
                }
            });
        }
        out.insert(name.clone(), draft);
    }
    out
}

/// Semantics whose axes pair with each other (a feature over two of them).
const PAIRED: [&str; 3] = ["tokens", "atoms", "rset"];

fn len_of(lengths: &[Anchor], s: &str) -> Option<usize> {
    lengths.iter().find(|a| a.semantic == s).map(|a| a.len)
}

/// Whether a tensor has exactly these anchored semantics' lengths, axis by axis.
fn shaped(t: &Tensor, lengths: &[Anchor], want: &[&str]) -> bool {
    t.shape.len() == want.len()
        && t.shape
            .iter()
            .zip(want)
            .all(|(&n, s)| len_of(lengths, s) == Some(n))
}

/// Incoming pads: a 1-D 0/1 feature over a sharded semantic that is 1 on a prefix and 0
/// after, and whose items after the prefix own nothing and are owned by nothing in the
/// sample's one-hot maps; never a flag named as one (`is_*`, `has_*`: a flag of some
/// real items, such as AlphaFold3's `is_protein` or `has_frame`, is 1 on a prefix when
/// those items come first). Returns the real item count of every semantic that
/// arrives padded.
fn incoming(
    sample: &Sample,
    lengths: &[Anchor],
    semantics: &mut [SemanticDraft],
    features: &mut BTreeMap<String, FeatureDraft>,
) -> BTreeMap<String, usize> {
    let mut real = BTreeMap::new();
    let ids = id_vectors(sample, lengths, features);
    for s in semantics.iter_mut().filter(|s| s.sharded) {
        let mut found: Vec<(&String, usize)> = sample
            .tensors
            .iter()
            .filter(|(n, _)| features.get(*n).is_some_and(|f| f.axes == [s.name.clone()]))
            .filter(|(n, _)| !shows::is_flag(n))
            .filter_map(|(n, t)| Some((n, shows::padded_prefix(t.zero_one()?)?)))
            .filter(|&(n, real)| pads_own_nothing(sample, n, real))
            .filter(|&(_, real)| !named_past(sample, &ids, &s.name, real))
            .collect();
        // Of several, those named as masks, and of those the one named for the semantic.
        if found.iter().filter(|(n, _)| n.contains("mask")).count() > 0 {
            found.retain(|(n, _)| n.contains("mask"));
        }
        if let [one] = found
            .iter()
            .filter(|(n, _)| names_mask_of(n, &s.name))
            .collect::<Vec<_>>()[..]
        {
            found = vec![*one];
        }
        if found.is_empty() {
            continue;
        }
        if found.iter().all(|(_, n)| *n == found[0].1) {
            real.insert(s.name.clone(), found[0].1);
        }
        let names: Vec<&String> = found.iter().map(|(m, _)| *m).collect();
        let mask = question_or(&names, "").unwrap_or_default();
        for (m, n) in &found {
            let Some(f) = features.get_mut(*m) else {
                continue;
            };
            if found.len() == 1 {
                f.keys.push(format!("mask: {}", s.name));
            }
            let choose = if found.len() > 1 {
                format!(" (if you choose it, add `mask: {}`)", s.name)
            } else {
                String::new()
            };
            f.notes.push(format!(
                "# proposed: {m} is 1 on the first {n} {} and 0 after: a mask of the real items{choose}",
                s.name
            ));
        }
        let pad = real.get(&s.name).and_then(|&n| map_pad(sample, &ids, n));
        let pad = pad.map_or(String::new(), |p| format!(", map_pad: {p}"));
        s.keys.push(format!("incoming_pads: {{mask: {mask}{pad}}}"));
        s.proposed = true;
    }
    real
}

/// Whether an owner id vector (a token id per atom) says the items of `semantic` from
/// `real` on are real: an atom there has a token, or a token there has an atom. Such a
/// 0/1 feature is a flag of some real items (`ref_mask`), never their pad mask.
fn named_past(sample: &Sample, ids: &[String], semantic: &str, real: usize) -> bool {
    ids.iter()
        .filter_map(|m| sample.tensors.get(m)?.values.as_deref())
        .any(|v| match semantic {
            "atoms" => {
                let pads = map_pad(sample, ids, real).is_some();
                !pads
                    && v.get(real..)
                        .is_some_and(|past| past.iter().any(|&x| x != -1.0))
            }
            "tokens" => v.iter().any(|&x| x >= real as f64),
            _ => false,
        })
}

/// A name a featurizer gives the mask of a semantic's real items: `token_mask`,
/// `atom_pad_mask`, `msa_mask` (for `tokens`, `atoms`, `msa`).
fn names_mask_of(name: &str, semantic: &str) -> bool {
    let stem = semantic.strip_suffix('s').unwrap_or(semantic);
    name == format!("{stem}_mask") || name == format!("{stem}_pad_mask")
}

/// The featurizer's own masks (`names_mask_of`) that `incoming` did not take, whose
/// values a mask of real items may have (1 on a prefix, or everywhere): `mask:` over
/// the semantic, or over every semantic of a 2-D mask named for its first
/// (`msa_mask [msa, tokens]`).
fn own_masks(sample: &Sample, features: &mut BTreeMap<String, FeatureDraft>) {
    for (name, f) in features.iter_mut() {
        let Some(v) = sample.tensors.get(name).and_then(Tensor::zero_one) else {
            continue;
        };
        let semantics = f
            .axes
            .iter()
            .all(|a| a.parse::<usize>().is_err() && !a.starts_with("QUESTION"));
        let Some(first) = f
            .axes
            .first()
            .filter(|a| semantics && names_mask_of(name, a))
        else {
            continue;
        };
        let full = shows::padded_prefix(v).is_some() || v.iter().all(|&x| x == 1.0);
        let one_d_real = f.axes.len() > 1 || full;
        if !f.keys.is_empty() || !one_d_real || f.axes.len() > 2 {
            continue;
        }
        let of = match f.axes.as_slice() {
            [_] => first.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        f.notes.push(format!(
            "# proposed: {name} is the featurizer's mask of the real {} (1 on every real item here)",
            f.axes.join(" x ")
        ));
        f.keys.push(format!("mask: {of}"));
    }
}

/// Whether the items from `real` on along `mask`'s axis hold no entry of any 0/1 map
/// of the sample: no row of a map over them (they have no owner) and no column of a
/// map onto them (they own nothing). Padded items are empty in every map; real items
/// after a type flag's prefix are not.
fn pads_own_nothing(sample: &Sample, mask: &str, real: usize) -> bool {
    let Some(len) = sample
        .tensors
        .get(mask)
        .and_then(|t| t.shape.first().copied())
    else {
        return true;
    };
    sample
        .tensors
        .iter()
        .filter(|(n, _)| n.as_str() != mask)
        .filter_map(|(_, t)| Some((t.shape.as_slice(), t.zero_one()?)))
        .all(|(shape, v)| match *shape {
            [rows, cols] if rows == len => v[real * cols..].iter().all(|&x| x == 0.0),
            [_, cols] if cols == len => v.chunks(cols).all(|r| r[real..].iter().all(|&x| x == 0.0)),
            _ => true,
        })
}

/// Whether a 2-axis tensor is a one-hot map along axis 1, and how many rows hold a 1.
fn one_hot(t: &Tensor) -> Option<usize> {
    let (Some(v), [_, cols]) = (t.values.as_deref(), t.shape.as_slice()) else {
        return None;
    };
    shows::one_hot_rows(v, *cols)
}

fn named(s: &mut [SemanticDraft], name: &str) -> Option<usize> {
    s.iter().position(|d| d.name == name)
}

fn question_or(one_of: &[&String], none: &str) -> Option<String> {
    match one_of {
        [] => (!none.is_empty()).then(|| format!("QUESTION({none})")),
        [one] => Some((*one).clone()),
        many => Some(format!(
            "QUESTION({})",
            many.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("|")
        )),
    }
}

/// Owners: atoms by a counts feature and/or a one-hot map onto tokens, R-set rows by a
/// map onto atoms (with `unowned_rows: pad` when some rows have none).
fn owners(
    sample: &Sample,
    lengths: &[Anchor],
    real: &BTreeMap<String, usize>,
    semantics: &mut [SemanticDraft],
    features: &mut BTreeMap<String, FeatureDraft>,
) {
    if let (Some(_), Some(n_atoms), Some(i)) = (
        len_of(lengths, "tokens"),
        len_of(lengths, "atoms"),
        named(semantics, "atoms"),
    ) {
        let atoms = real.get("atoms").copied().unwrap_or(n_atoms);
        let counts: Vec<&String> = sample
            .tensors
            .iter()
            .filter(|(_, t)| shaped(t, lengths, &["tokens"]) && t.is_integer())
            .filter(|(_, t)| {
                t.values.as_ref().is_some_and(|v| {
                    v.iter().all(|&x| x >= 0.0) && v.iter().sum::<f64>() == atoms as f64
                })
            })
            .map(|(n, _)| n)
            .collect();
        let mut maps: Vec<&String> = sample
            .tensors
            .iter()
            .filter(|(_, t)| shaped(t, lengths, &["atoms", "tokens"]) && one_hot(t) == Some(atoms))
            .map(|(n, _)| n)
            .collect();
        let ids = id_vectors(sample, lengths, features);
        for m in &ids {
            let f = features.entry(m.clone()).or_default();
            let none = sample.tensors[m]
                .values
                .as_ref()
                .is_some_and(|v| v.contains(&-1.0));
            f.keys.push(format!(
                "pad: -1, index: {{of: tokens, scope: shard_local{}}}",
                if none { ", none: -1" } else { "" }
            ));
            f.notes.push(format!(
                "# proposed: {m} is a token id per atom (in token order): the atoms' owner map"
            ));
        }
        maps.extend(&ids);
        // An atom whose id is -1 has no token: dropped as a pad, as the spec must say.
        let unowned = ids.iter().any(|m| {
            let v = sample.tensors[m].values.as_deref();
            v.is_some_and(|v| v.contains(&-1.0))
        });
        let s = &mut semantics[i];
        s.keys.push("owner: tokens".into());
        let none = if maps.is_empty() {
            "no [tokens] integer feature sums to the atoms"
        } else {
            ""
        };
        if let Some(c) = question_or(&counts, none) {
            s.keys.push(format!("counts: {c}"));
        }
        if let Some(m) = question_or(&maps, "") {
            s.keys.push(format!("map: {m}"));
        }
        if unowned {
            s.keys.push("unowned_rows: pad".into());
        }
        s.proposed = true;
    }
    rset_owner(sample, lengths, semantics);
}

/// R-set rows owned through a one-hot map onto atoms (with `unowned_rows: pad` when
/// some rows have none).
fn rset_owner(sample: &Sample, lengths: &[Anchor], semantics: &mut [SemanticDraft]) {
    if let (Some(rows), Some(_), Some(i)) = (
        len_of(lengths, "rset"),
        len_of(lengths, "atoms"),
        named(semantics, "rset"),
    ) {
        let maps: Vec<(&String, usize)> = sample
            .tensors
            .iter()
            .filter(|(_, t)| shaped(t, lengths, &["rset", "atoms"]))
            .filter_map(|(n, t)| Some((n, one_hot(t)?)))
            .collect();
        // Where rows and tokens are as many, token maps fit too: those named for the
        // R-set first, else a question.
        let named: Vec<(&String, usize)> = maps
            .iter()
            .copied()
            .filter(|(m, _)| m.contains("r_set") || m.contains("rset"))
            .collect();
        let maps = if named.is_empty() { maps } else { named };
        let names: Vec<&String> = maps.iter().map(|(m, _)| *m).collect();
        if let Some(m) = question_or(&names, "") {
            let s = &mut semantics[i];
            s.keys.push(format!("owner: atoms, map: {m}"));
            if maps.iter().any(|&(_, owned)| owned < rows) {
                s.keys.push("unowned_rows: pad".into());
            }
            s.proposed = true;
        }
    }
}

/// `[atoms]` integer features holding a token id per atom (AlphaFold3's
/// `atom_to_token_idx`): every value a token or -1, in token order, the last real token
/// owning some atom (`shows::owner_ids_padded`: tokens padded to a budget own nothing,
/// atoms a collator padded name one token out of order). Of several, those named for
/// tokens.
fn id_vectors(
    sample: &Sample,
    lengths: &[Anchor],
    features: &BTreeMap<String, FeatureDraft>,
) -> Vec<String> {
    let owners = token_counts(sample, lengths, features);
    let mut found: Vec<String> = sample
        .tensors
        .iter()
        .filter(|(n, t)| features.get(*n).is_some_and(|f| f.axes == ["atoms"]) && t.is_integer())
        .filter(|(_, t)| {
            t.values.as_deref().is_some_and(|v| {
                owners
                    .iter()
                    .any(|&n| shows::owner_ids_padded(v, n).is_some())
            })
        })
        .map(|(n, _)| n.clone())
        .collect();
    // Of several, or beside a one-hot map, those named for the tokens (Boltz-2's
    // `ref_space_uid` counts residues: one a token in a protein).
    let one_hot_map = sample
        .tensors
        .values()
        .any(|t| shaped(t, lengths, &["atoms", "tokens"]) && one_hot(t).is_some());
    if one_hot_map || found.iter().any(|n| n.contains("token")) {
        found.retain(|n| n.contains("token"));
    }
    found
}

/// How many tokens the sample may hold: its token length, or the real tokens a 0/1
/// `[tokens]` feature marks with a prefix (a token budget's pads after them).
fn token_counts(
    sample: &Sample,
    lengths: &[Anchor],
    features: &BTreeMap<String, FeatureDraft>,
) -> Vec<usize> {
    let Some(tokens) = len_of(lengths, "tokens") else {
        return Vec::new();
    };
    let prefixes = sample
        .tensors
        .iter()
        .filter(|(n, _)| features.get(*n).is_some_and(|f| f.axes == ["tokens"]))
        .filter_map(|(_, t)| shows::padded_prefix(t.zero_one()?));
    std::iter::once(tokens).chain(prefixes).collect()
}

/// The id a collator gave an id vector's pads (`shows::pad_id`), where its real items
/// are the first `real`.
fn map_pad(sample: &Sample, ids: &[String], real: usize) -> Option<f64> {
    ids.iter()
        .find_map(|m| shows::pad_id(sample.tensors.get(m)?.values.as_deref()?, real))
}

/// Integer features over tokens holding ids of their atoms (`shows::item_ids`): each
/// token's first atom (`start_atom_index`), or `[tokens, k]` atom ids some of the row's
/// own token's (a frame's atoms, `frame_atom_index`; -1 is their none value). Both
/// move with the atoms (`padded_global`).
fn atom_indexes(
    sample: &Sample,
    lengths: &[Anchor],
    owner_of_atom: &[Option<usize>],
    features: &mut BTreeMap<String, FeatureDraft>,
) {
    for (name, t) in &sample.tensors {
        let Some(v) = t.values.as_deref() else {
            continue;
        };
        if !t.is_integer() || !shaped_first(t, lengths, "tokens") {
            continue;
        }
        let Some(f) = features.get_mut(name).filter(|f| f.keys.is_empty()) else {
            continue;
        };
        match shows::item_ids(name, "atoms", &t.shape, v, owner_of_atom) {
            Some(shows::ItemIds::First) => {
                f.keys
                    .push("index: {of: atoms, scope: padded_global}".to_owned());
                f.notes.push(format!(
                    "# proposed: {name} holds each token's first atom: it moves with the atoms"
                ));
            }
            Some(shows::ItemIds::Own { none }) => {
                f.keys.push(format!(
                    "pad: -1, index: {{of: atoms, scope: padded_global{}}}",
                    if none { ", none: -1" } else { "" }
                ));
                f.notes.push(format!(
                    "# proposed: {name} holds ids of its token's atoms{}: they move with the atoms",
                    if none { " (-1: none)" } else { "" }
                ));
            }
            None => {}
        }
    }
}

/// Whether axis 0 of `t` has `semantic`'s length.
fn shaped_first(t: &Tensor, lengths: &[Anchor], semantic: &str) -> bool {
    t.shape.first().copied() == len_of(lengths, semantic)
}

/// A one-hot map between an owner and its items is a block diagonal. Questions count
/// with each of their options.
fn one_hot_maps(sample: &Sample, features: &mut BTreeMap<String, FeatureDraft>) {
    let options = |x: &str| -> Vec<String> {
        match x
            .strip_prefix("QUESTION(")
            .and_then(|r| r.strip_suffix(')'))
        {
            Some(inner) => inner.split('|').map(str::to_owned).collect(),
            None => vec![x.to_owned()],
        }
    };
    for (name, f) in features.iter_mut() {
        let [a, b] = f.axes.as_slice() else { continue };
        let related = options(a).iter().any(|x| {
            options(b).iter().any(|y| {
                matches!(
                    (x.as_str(), y.as_str()),
                    ("atoms", "tokens") | ("tokens", "atoms") | ("rset", "atoms")
                )
            })
        });
        if related && one_hot(&sample.tensors[name]).is_some() {
            f.notes.push(format!(
                "# proposed: {name} is a one-hot map along axis 1, co-sharded with axis 0"
            ));
            let b = b.clone();
            f.keys.push(format!(
                "coshard: [{{axis: 1, follows: 0}}], index: {{of: {b}, scope: shard_local, one_hot: 1}}"
            ));
        }
    }
}

/// A feature whose last axis is a channel axis holding one 1 per row, or none (a pad
/// row), is proposed one-hot along it. A distribution that happens to be one-hot in
/// this sample (a profile without MSA) would be proposed too: the note says to check.
fn one_hot_channels(sample: &Sample, features: &mut BTreeMap<String, FeatureDraft>) {
    for (name, f) in features.iter_mut() {
        let t = &sample.tensors[name];
        let (Some(last), true) = (t.shape.last().copied(), f.keys.is_empty()) else {
            continue;
        };
        let channel = f
            .axes
            .last()
            .is_some_and(|a| a.parse::<usize>() == Ok(last));
        let Some(v) = t
            .values
            .as_deref()
            .filter(|_| channel && last > 1 && t.shape.len() > 1)
        else {
            continue;
        };
        if shows::one_hot_rows(v, last).is_some() {
            let axis = t.shape.len() - 1;
            f.notes.push(format!(
                "# proposed: {name} is one-hot over {last} classes along axis {axis} (every row one 1, or none); check that it is not a distribution"
            ));
            f.keys.push(format!("one_hot: {axis}"));
        }
    }
}

/// A plain pair feature (its first two axes one semantic, as `[tokens, tokens]`) under 1%
/// nonzero in this sample is proposed sparse: it then travels and rests as its nonzero
/// entries. Another sample may be fuller: the note says to check.
fn sparse_pairs(sample: &Sample, features: &mut BTreeMap<String, FeatureDraft>) {
    for (name, f) in features.iter_mut() {
        let Some(v) = sample.tensors[name].values.as_deref() else {
            continue;
        };
        // A pair either way: the same semantic, or the same question, on both axes.
        let semantic = |a: &str| a.parse::<usize>().is_err();
        let pair = f.axes.len() >= 2 && semantic(&f.axes[0]) && f.axes[0] == f.axes[1];
        if pair
            && f.keys.is_empty()
            && !v.is_empty()
            && shows::nonzero_share(v) < shows::SPARSE_BELOW
        {
            let share = 100.0 * shows::nonzero_share(v);
            f.notes.push(format!(
                "# proposed: {name} is {share:.2}% nonzero here: sparse, it travels as its nonzero entries; check that it is mostly zero in every sample"
            ));
            f.keys.push("sparse: true".to_owned());
        }
    }
}

/// Lists: unsharded semantics; their integer features pad with -1 at DP collate, and
/// `*_index` lists whose values all name real atoms are atom ids.
fn list_roles(
    sample: &Sample,
    lengths: &[Anchor],
    lists: &[List],
    real: &BTreeMap<String, usize>,
    semantics: &mut Vec<SemanticDraft>,
    features: &mut BTreeMap<String, FeatureDraft>,
) {
    let atoms = real.get("atoms").copied().or(len_of(lengths, "atoms"));
    for l in lists {
        semantics.push(SemanticDraft {
            name: l.semantic.clone(),
            sharded: false,
            keys: Vec::new(),
            proposed: true,
            note: format!(
                "a list of length {} (axis 1 of {}_index)",
                l.len, l.semantic
            ),
        });
        for (m, _) in &l.members {
            let t = &sample.tensors[m];
            let Some(f) = features.get_mut(m) else {
                continue;
            };
            if !t.is_integer() {
                continue;
            }
            f.keys.push("pad: -1".into());
            let ids = t.values.as_ref();
            let atom_ids = m.ends_with("_index")
                && match (ids, atoms) {
                    (Some(v), Some(n)) if !v.is_empty() => {
                        v.iter().all(|&x| x >= 0.0 && x < n as f64)
                    }
                    // An empty list shows nothing: its name says what it holds.
                    (Some(_), _) => !m.contains("chain") && t.shape.len() == 2,
                    _ => false,
                };
            if atom_ids {
                f.keys
                    .push("index: {of: atoms, scope: padded_global}".into());
                f.notes.push(format!(
                    "# proposed: {m} holds atom ids (a list of its own length; -1 pads it at collate)"
                ));
            }
        }
    }
}

/// An integer `[msa, tokens]` feature whose values are classes of a one-hot token
/// feature (`msa` holding `restype`'s residue classes): `range:` those classes (every
/// value is checked, and it travels narrow). What a padded token reads there is the
/// featurizer's gap class, which the values cannot tell: the note asks for it.
fn class_ids(sample: &Sample, features: &mut BTreeMap<String, FeatureDraft>) {
    let mut classes: Vec<(String, usize)> = features
        .iter()
        .filter(|(_, f)| {
            f.axes.len() == 2
                && f.axes[0] == "tokens"
                && f.keys.iter().any(|k| k.starts_with("one_hot"))
        })
        .filter_map(|(n, f)| Some((n.clone(), f.axes[1].parse().ok()?)))
        .collect();
    // The residue types first: a profile one-hot in one sample is a distribution.
    classes.sort_by_key(|(n, _)| !(n.contains("restype") || n.contains("res_type")));
    for (name, f) in features.iter_mut() {
        let t = &sample.tensors[name];
        let (Some(v), true) = (
            t.values.as_deref(),
            f.axes == ["msa", "tokens"] && t.is_integer(),
        ) else {
            continue;
        };
        let top = v.iter().copied().fold(f64::MIN, f64::max);
        let fits = v.iter().all(|&x| x >= 0.0 && x.fract() == 0.0);
        let Some((of, width)) = classes.iter().find(|(_, w)| fits && top < *w as f64) else {
            continue;
        };
        if !f.keys.is_empty() {
            continue;
        }
        f.keys.push(format!("range: [0, {}]", width - 1));
        f.notes.push(format!(
            "# proposed: {name} holds classes of {of} (0 to {}); a padded token reads `pad:` here (0 unless declared): declare the featurizer's gap class (Protenix: 31)",
            width - 1
        ));
    }
}

/// A `[S, S]` 0/1 feature equal to the outer product of a 1-D 0/1 feature over `S`.
fn derived(sample: &Sample, features: &mut BTreeMap<String, FeatureDraft>) {
    let masks: Vec<(&String, &[f64], String)> = sample
        .tensors
        .iter()
        .filter_map(|(n, t)| {
            let axis = features.get(n)?.axes.first()?.clone();
            let v = t.zero_one().filter(|v| v.contains(&1.0))?;
            (t.shape.len() == 1).then_some((n, v, axis))
        })
        .collect();
    for (name, t) in &sample.tensors {
        let Some(f) = features.get_mut(name) else {
            continue;
        };
        let ([a, b], Some(v)) = (f.axes.as_slice(), t.zero_one().filter(|v| v.contains(&1.0)))
        else {
            continue;
        };
        if a != b || a.starts_with("QUESTION(") {
            continue;
        }
        let of: Vec<&String> = masks
            .iter()
            .filter(|(m, x, s)| {
                *m != name && s == a && x.len() * x.len() == v.len() && {
                    let n = x.len();
                    (0..n * n).all(|k| v[k] == x[k / n] * x[k % n])
                }
            })
            .map(|(m, _, _)| *m)
            .collect();
        if let Some(m) = question_or(&of, "") {
            f.keys.push(format!("mask: {a}, derive: {{outer: [{m}]}}"));
            f.notes.push(format!(
                "# proposed: {name} is the outer product of {m}: the pipeline can make it"
            ));
        }
    }
}
