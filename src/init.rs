//! `featshard init --from sample.safetensors`: a draft spec from one serial sample.
//!
//! Axis semantics are proposed by matching axis lengths against anchor features (the
//! first axis of `--tokens KEY` has the token length, and so on). A length that matches
//! two semantics is never guessed: the axis becomes `QUESTION(tokens|atoms)`, which the
//! spec check rejects until it is answered. Owner counts, owner maps and co-sharded
//! one-hot maps are proposed from the values and marked `# proposed:`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use crate::commands::Failure;

/// Semantics `init` knows, in declaration order: name and whether it shards.
const KNOWN: [(&str, bool); 6] = [
    ("tokens", true),
    ("atoms", true),
    ("msa", true),
    ("rset", true),
    ("ensemble", false),
    ("templates", false),
];

/// The anchor feature of each semantic (`--tokens KEY` ...).
pub type Anchors = BTreeMap<String, String>;

struct Tensor {
    dtype: Dtype,
    shape: Vec<usize>,
    /// Integer values, for tensors small enough to inspect.
    ints: Option<Vec<i64>>,
}

fn dtype_name(d: Dtype) -> Option<&'static str> {
    Some(match d {
        Dtype::BOOL => "bool",
        Dtype::U8 => "uint8",
        Dtype::I8 => "int8",
        Dtype::I16 => "int16",
        Dtype::I32 => "int32",
        Dtype::I64 => "int64",
        Dtype::F16 => "float16",
        Dtype::BF16 => "bfloat16",
        Dtype::F32 => "float32",
        Dtype::F64 => "float64",
        _ => return None,
    })
}

/// Integer values of a tensor (little-endian, as safetensors stores them).
fn ints(d: Dtype, data: &[u8]) -> Option<Vec<i64>> {
    let chunks = |n: usize| data.chunks_exact(n);
    Some(match d {
        Dtype::BOOL | Dtype::U8 => data.iter().map(|&b| i64::from(b)).collect(),
        Dtype::I8 => data.iter().map(|&b| i64::from(b as i8)).collect(),
        Dtype::I16 => chunks(2)
            .map(|c| i64::from(i16::from_le_bytes([c[0], c[1]])))
            .collect(),
        Dtype::I32 => chunks(4)
            .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        Dtype::I64 => chunks(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        _ => return None,
    })
}

/// Whether a 2-axis integer tensor is a one-hot map along axis 1 (0/1, at most one 1
/// per row) and whether every row has exactly one.
fn one_hot(t: &Tensor) -> Option<bool> {
    let (v, [rows, cols]) = (t.ints.as_ref()?, t.shape.as_slice()) else {
        return None;
    };
    // All zeros says nothing: a map has at least one 1.
    if v.iter().any(|&x| x != 0 && x != 1) || *cols == 0 || !v.contains(&1) {
        return None;
    }
    let mut every_row = true;
    for r in 0..*rows {
        let ones: i64 = v[r * cols..(r + 1) * cols].iter().sum();
        if ones > 1 {
            return None;
        }
        every_row &= ones == 1;
    }
    Some(every_row)
}

/// Writes the draft spec for one sample file.
pub fn draft(path: &Path, anchors: &Anchors, module: &str) -> Result<String, Failure> {
    let bytes = std::fs::read(path)
        .map_err(|e| Failure::Other(format!("cannot read {}: {e}", path.display())))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| Failure::Other(format!("{}: not a safetensors file: {e}", path.display())))?;
    let mut tensors: BTreeMap<String, Tensor> = BTreeMap::new();
    for (name, view) in file.tensors() {
        // Values are read for small integer tensors only (maps and counts).
        let small = view.data().len() <= 256 * 1024 * 1024;
        tensors.insert(
            name,
            Tensor {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                ints: if small {
                    ints(view.dtype(), view.data())
                } else {
                    None
                },
            },
        );
    }
    // Lengths of the anchored semantics.
    let mut lengths: Vec<(&str, bool, usize, &str)> = Vec::new();
    for (sem, sharded) in KNOWN {
        let Some(key) = anchors.get(sem) else {
            continue;
        };
        let t = tensors.get(key).ok_or_else(|| {
            Failure::Other(format!(
                "--{sem} {key}: no feature `{key}` in {}",
                path.display()
            ))
        })?;
        let len = *t.shape.first().ok_or_else(|| {
            Failure::Other(format!(
                "--{sem} {key}: feature `{key}` is a scalar, it has no axis 0"
            ))
        })?;
        lengths.push((sem, sharded, len, key));
    }
    if lengths.is_empty() {
        return Err(Failure::Other(
            "give at least one anchor, e.g. --tokens token_index --atoms ref_pos".into(),
        ));
    }
    let sem_len = |s: &str| lengths.iter().find(|l| l.0 == s).map(|l| l.2);

    // Each axis: the semantic whose length it has, a channel, or a question.
    let mut axes_of: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut questions: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, t) in &tensors {
        let mut axes = Vec::new();
        for (d, &n) in t.shape.iter().enumerate() {
            let anchored = lengths.iter().find(|l| l.3 == name && d == 0).map(|l| l.0);
            let matches: Vec<&str> = lengths.iter().filter(|l| l.2 == n).map(|l| l.0).collect();
            axes.push(match (anchored, matches.as_slice()) {
                (Some(s), _) => s.to_owned(),
                (None, []) => n.to_string(),
                (None, [one]) => (*one).to_owned(),
                (None, many) => {
                    questions.entry(name).or_default().push(format!(
                        "axis {d} has length {n}, which is the length of {}: which is it?",
                        many.join(" and ")
                    ));
                    format!("QUESTION({})", many.join("|"))
                }
            });
        }
        axes_of.insert(name, axes);
    }
    // Shapes, not proposed axes, so that a question on an axis does not hide a proposal.
    let shaped = |t: &Tensor, want: &[&str]| {
        t.shape.len() == want.len()
            && t.shape
                .iter()
                .zip(want)
                .all(|(&n, s)| sem_len(s) == Some(n))
    };

    // Owner proposals: atoms by a counts feature, R-set rows by a map onto atoms.
    let mut owners: BTreeMap<&str, String> = BTreeMap::new();
    if let (Some(_), Some(n_atoms)) = (sem_len("tokens"), sem_len("atoms")) {
        let candidates: Vec<&String> = tensors
            .iter()
            .filter(|(_, t)| {
                shaped(t, &["tokens"])
                    && t.ints.as_ref().is_some_and(|v| {
                        v.iter().all(|&x| x >= 0) && v.iter().sum::<i64>() == n_atoms as i64
                    })
            })
            .map(|(n, _)| n)
            .collect();
        owners.insert(
            "atoms",
            match candidates.as_slice() {
                [one] => format!("owner: tokens, counts: {one}"),
                [] => {
                    "owner: tokens, counts: QUESTION(no [tokens] integer feature sums to the atoms)"
                        .into()
                }
                many => format!(
                    "owner: tokens, counts: QUESTION({})",
                    many.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join("|")
                ),
            },
        );
    }
    if sem_len("rset").is_some() && sem_len("atoms").is_some() {
        let candidates: Vec<&String> = tensors
            .iter()
            .filter(|(_, t)| shaped(t, &["rset", "atoms"]) && one_hot(t) == Some(true))
            .map(|(n, _)| n)
            .collect();
        if let [one] = candidates.as_slice() {
            owners.insert("rset", format!("owner: atoms, map: {one}"));
        }
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Draft featshard spec from {} (featshard init).",
        path.display()
    );
    let _ = writeln!(
        out,
        "# Answer every QUESTION(...) (write one of the listed semantics or a channel"
    );
    let _ = writeln!(
        out,
        "# size) and check every `# proposed:` line; `featshard validate` fails until then."
    );
    let _ = writeln!(
        out,
        "version: 1\nmodule: {module}\nmesh:\n  cp: [cp0, cp1]\n  dp: dp\nsemantics:"
    );
    for (sem, sharded, len, key) in &lengths {
        match owners.get(sem) {
            Some(owner) => {
                let _ = writeln!(
                    out,
                    "  {sem}: {{shard: {sharded}, {owner}}}  # proposed: length {len} (axis 0 of {key})"
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  {sem}: {{shard: {sharded}}}  # length {len} (axis 0 of {key})"
                );
            }
        }
    }
    let _ = writeln!(out, "features:");
    for (name, t) in &tensors {
        let Some(dtype) = dtype_name(t.dtype) else {
            return Err(Failure::Other(format!(
                "feature `{name}`: dtype {:?} has no featshard equivalent",
                t.dtype
            )));
        };
        for q in questions.get(name.as_str()).into_iter().flatten() {
            let _ = writeln!(out, "  # QUESTION {name}: {q}");
        }
        let axes = &axes_of[name.as_str()];
        let mut extra = String::new();
        // A one-hot map between an owner and its items is a block diagonal. Questions
        // count with each of their options.
        if let [a, b] = axes.as_slice() {
            let options = |x: &str| -> Vec<String> {
                match x
                    .strip_prefix("QUESTION(")
                    .and_then(|r| r.strip_suffix(')'))
                {
                    Some(inner) => inner.split('|').map(str::to_owned).collect(),
                    None => vec![x.to_owned()],
                }
            };
            let related = options(a).iter().any(|x| {
                options(b).iter().any(|y| {
                    matches!(
                        (x.as_str(), y.as_str()),
                        ("atoms", "tokens") | ("tokens", "atoms") | ("rset", "atoms")
                    )
                })
            });
            if related && one_hot(t).is_some() {
                let _ = writeln!(
                    out,
                    "  # proposed: {name} is a one-hot map along axis 1, co-sharded with axis 0"
                );
                extra = format!(
                    ", coshard: [{{axis: 1, follows: 0}}], index: {{of: {b}, scope: shard_local, one_hot: 1}}"
                );
            }
        }
        let _ = writeln!(
            out,
            "  {name}: {{axes: [{}], dtype: {dtype}{extra}}}",
            axes.join(", ")
        );
    }
    Ok(out)
}
