//! The draft spec as YAML text, with its questions and proposals as comments.

use std::fmt::Write as _;
use std::path::Path;

use super::propose::Proposals;
use super::read::{spec_dtype, Anchor, Sample};
use crate::commands::Failure;
use featshard_spec::names::{is_feature_name, is_snake_case};

/// The draft's opening comments, its module and its mesh.
fn header(path: &Path, module: &str, separator: Option<&str>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Draft featshard spec from {} (featshard init).",
        path.display()
    );
    let _ = writeln!(
        out,
        "# Answer every QUESTION(...) (write one of the listed names or a channel"
    );
    let _ = writeln!(
        out,
        "# size) and check every `# proposed:` line; `featshard validate` fails until then."
    );
    let _ = writeln!(
        out,
        "# Keys the model never reads go under `drop:`; features a sample may lack get"
    );
    let _ = writeln!(out, "# `optional: true`.");
    let _ = writeln!(
        out,
        "version: 1\nmodule: {module}\nmesh:\n  # A 2-D tile, its axes named as the model's device mesh names them (Boltz-CP's:\n  # dp, cp_axis_0, cp_axis_1); or `cp: [cp]`: one CP axis of any size, nothing else changes.\n  cp: [cp_axis_0, cp_axis_1]\n  dp: dp"
    );
    if let Some(sep) = separator {
        let _ = writeln!(
            out,
            "# proposed: the file joins a nested dict's keys by `{sep}` (`a{sep}b` is feature `a.b`)\nseparator: \"{sep}\""
        );
    }
    let _ = writeln!(out, "semantics:");
    out
}

pub fn spec(
    path: &Path,
    module: &str,
    sample: &Sample,
    _lengths: &[Anchor],
    p: &Proposals,
) -> Result<String, Failure> {
    let mut out = header(path, module, sample.separator);
    for s in &p.semantics {
        let keys: String = s.keys.iter().map(|k| format!(", {k}")).collect();
        let tag = if s.proposed { "proposed: " } else { "" };
        let _ = writeln!(
            out,
            "  {}: {{shard: {}{keys}}}  # {tag}{}",
            s.name, s.sharded, s.note
        );
    }
    let _ = writeln!(out, "features:");
    for name in sample
        .tensors
        .keys()
        .chain(&sample.metadata)
        .filter(|n| !is_feature_name(n))
    {
        // Written escaped, in a comment: a name is never YAML of the draft.
        let _ = writeln!(
            out,
            "  # left out: {name:?} is not a spec feature name (snake_case, or a path of such names joined by `.`); rename it in the featurizer"
        );
    }
    for (name, t) in sample.tensors.iter().filter(|(n, _)| is_feature_name(n)) {
        let Some(dtype) = spec_dtype(t.dtype).map(|d| d.name()) else {
            return Err(Failure::Other(format!(
                "feature `{name}`: dtype {:?} has no featshard equivalent",
                t.dtype
            )));
        };
        let Some(f) = p.features.get(name) else {
            continue;
        };
        for n in &f.notes {
            let _ = writeln!(out, "  {n}");
        }
        let keys: String = f.keys.iter().map(|k| format!(", {k}")).collect();
        let _ = writeln!(
            out,
            "  {name}: {{axes: [{}], dtype: {dtype}{keys}}}",
            f.axes.join(", ")
        );
    }
    for (note, line) in &p.derived {
        let _ = writeln!(out, "  {note}\n  {line}");
    }
    for m in sample.metadata.iter().filter(|n| is_snake_case(n)) {
        let _ = writeln!(
            out,
            "  # proposed: {m} is in the file's metadata: a value that is not a tensor"
        );
        let _ = writeln!(out, "  {m}: {{metadata: true}}");
    }
    Ok(out)
}
