//! `featshard explain`: what a spec does on a mesh, as a table (every feature's
//! placement and shapes, intake, padded lengths, bytes, the topology table), a
//! terminal picture or SVG.

use std::fmt::Write as _;
use std::path::Path;

use featshard_exec::compact::ENTRY_BYTES;
use featshard_spec::plan::{
    chunk_sizes, FeaturePlan, FeatureShapes, Plan, ResolveError, Resolved, TensorPlan,
};
use featshard_spec::Mesh;

use crate::commands::{load, Failure, MeshArg};
use crate::sizes::{explain_lengths, feature_bytes, total_bytes};
use crate::text::{extents, human, shape, table};

/// What `featshard explain` draws.
#[derive(Clone, Copy, Debug, Default)]
pub enum View<'a> {
    /// A table of every feature.
    #[default]
    Table,
    /// One feature's tiles in the terminal.
    Picture {
        /// The feature drawn.
        feature: &'a str,
        /// ANSI colours, one per rank.
        color: bool,
    },
    /// SVG pictures of one feature, or of every tensor feature of the workflow.
    Svg {
        /// The feature drawn (`None`: every tensor feature).
        feature: Option<&'a str>,
        /// Where the SVG goes.
        file: &'a Path,
    },
}

/// `featshard explain`: a feature's layout on a mesh, as a table, a terminal picture or
/// SVG. With `lengths`, shapes are numbers (and the table ends with each rank's bytes on
/// every CP topology of as many ranks); without, they are written in terms of the
/// semantics.
pub fn explain(
    path: &Path,
    mesh: &MeshArg,
    lengths: Option<&[(String, usize)]>,
    workflow: Option<&str>,
    view: View,
) -> Result<String, Failure> {
    let (spec, plan) = load(path)?;
    let mesh = mesh.sizes(&plan)?;
    let names = plan
        .feature_names(workflow)
        .map_err(|e| Failure::Other(e.to_string()))?;
    let mut notes = Vec::new();
    let resolved = match lengths {
        None => None,
        Some(given) => Some(resolve_for_explain(
            &plan, mesh, given, workflow, &mut notes,
        )?),
    };
    let out = match view {
        View::Table => {
            let table = explain_table(&plan, mesh, &names, workflow, resolved.as_ref());
            let topologies = lengths
                .and_then(|given| crate::topology::table(&spec, &plan, mesh, given, workflow));
            table + &topologies.unwrap_or_default()
        }
        View::Picture { feature, color } => {
            let p = crate::picture::picture(&plan, mesh, feature, resolved.as_ref())?;
            crate::picture::render_text(&p, color)
        }
        View::Svg { feature, file } => {
            return explain_svg(&plan, mesh, &names, feature, file, resolved.as_ref());
        }
    };
    let mut out = out;
    for n in notes {
        let _ = writeln!(out, "note: {n}");
    }
    Ok(out)
}

/// The plan resolved on the lengths `--lengths` gave; a missing one says how to pass it.
fn resolve_for_explain(
    plan: &Plan,
    mesh: Mesh,
    given: &[(String, usize)],
    workflow: Option<&str>,
    notes: &mut Vec<String>,
) -> Result<Resolved, Failure> {
    let l = explain_lengths(plan, given, notes)?;
    plan.resolve(mesh, &l, workflow).map_err(|e| {
        let hint = match e {
            ResolveError::MissingLength { .. } | ResolveError::MissingOwnerLength { .. } => {
                " (pass it with --lengths)"
            }
            _ => "",
        };
        Failure::Other(format!("{e}{hint}"))
    })
}

/// `explain --svg`: one picture per chosen feature, written to `file`.
fn explain_svg(
    plan: &Plan,
    mesh: Mesh,
    names: &[&str],
    feature: Option<&str>,
    file: &Path,
    resolved: Option<&Resolved>,
) -> Result<String, Failure> {
    let chosen: Vec<&str> = match feature {
        Some(f) => vec![f],
        None => names
            .iter()
            .copied()
            .filter(|n| matches!(plan.features.get(*n), Some(FeaturePlan::Tensor(_))))
            .collect(),
    };
    let pictures = chosen
        .iter()
        .map(|n| crate::picture::picture(plan, mesh, n, resolved))
        .collect::<Result<Vec<_>, _>>()?;
    std::fs::write(file, crate::picture::render_svg(&pictures))
        .map_err(|e| Failure::Other(format!("cannot write {}: {e}", file.display())))?;
    Ok(format!(
        "wrote {} ({} feature picture{})",
        file.display(),
        pictures.len(),
        if pictures.len() == 1 { "" } else { "s" }
    ))
}

/// `explain`'s table: the mesh, every feature's row, intake, padded lengths.
fn explain_table(
    plan: &Plan,
    mesh: Mesh,
    names: &[&str],
    workflow: Option<&str>,
    resolved: Option<&Resolved>,
) -> String {
    let mut head = vec![
        "feature",
        "axes",
        "placement",
        "padded global shape",
        "local shape",
    ];
    if resolved.is_some() {
        head.extend(["dense bytes", "compact bytes"]);
    }
    let mut rows = vec![head.into_iter().map(str::to_owned).collect::<Vec<_>>()];
    rows.extend(names.iter().filter_map(|&name| {
        let f = plan.features.get(name)?;
        let mut row = feature_row(plan, mesh, name, f, resolved).to_vec();
        if let Some(r) = resolved {
            let bytes = plan.tensor(name).zip(r.features.get(name));
            let (d, c) = bytes.map_or(("-".to_owned(), "-".to_owned()), |(t, s)| {
                let (d, c) = feature_bytes(t, &s.global_shape);
                let per_entry = format!("{ENTRY_BYTES} B per nonzero");
                (human(d), c.map_or(per_entry, human))
            });
            row.extend([d, c]);
        }
        Some(row)
    }));
    let sizes: Vec<String> = mesh.sizes().iter().map(ToString::to_string).collect();
    let mut out = format!(
        "mesh ({}) = ({}): {} {} ranks{}\n\n",
        plan.mesh.axes().join(", "),
        sizes.join(", "),
        mesh.ranks(),
        if plan.mesh.is_domain() {
            "domain"
        } else {
            "CP"
        },
        workflow
            .map(|w| format!(", workflow {w}"))
            .unwrap_or_default()
    );
    out.push_str(&table(&rows));
    out.push_str(&intake_text(plan, names));
    if let Some(r) = resolved {
        out.push('\n');
        for (s, p) in &r.padded {
            let _ = writeln!(out, "{s}: padded to {p}");
        }
        out.push_str(&bytes_text(plan, names, r));
    }
    out
}

/// Every tensor feature's padded bytes, dense and compact, and their totals.
fn bytes_text(plan: &Plan, names: &[&str], r: &Resolved) -> String {
    let shapes = names
        .iter()
        .filter_map(|&n| Some((n, r.features.get(n)?.global_shape.as_slice())));
    let (dense, compact, sparse) = total_bytes(plan, shapes);
    let ratio = if compact == 0 {
        1.0
    } else {
        dense as f64 / compact as f64
    };
    let plus = match sparse {
        0 => String::new(),
        n => format!(" + {ENTRY_BYTES} B per nonzero of {n} sparse feature(s)"),
    };
    format!(
        "\nbytes per sample (padded global): dense {}, compact {}{plus} ({ratio:.1}x smaller; one-hot features as indices)\n",
        human(dense),
        human(compact)
    )
}

/// One feature's row of `explain`'s table.
fn feature_row(
    plan: &Plan,
    mesh: Mesh,
    name: &str,
    f: &FeaturePlan,
    resolved: Option<&Resolved>,
) -> [String; 5] {
    let FeaturePlan::Tensor(t) = f else {
        return [
            name.to_owned(),
            "metadata".into(),
            "passed through".into(),
            "-".into(),
            "-".into(),
        ];
    };
    let (global, local) = match resolved.map(|r| r.features.get(name)) {
        Some(Some(s)) => (shape(&s.global_shape), local_text(plan, t, s, mesh)),
        // An optional feature whose lengths were not given: as if absent.
        Some(None) => ("absent (optional)".into(), "-".into()),
        None => symbolic_shapes(plan, t, mesh),
    };
    [
        name.to_owned(),
        axes_text(t),
        t.placements
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        global,
        local,
    ]
}

/// What the pipeline does to a sample as the featurizer emits it, before the table's
/// layout: incoming pads, unowned rows, derived and optional features, dropped keys.
fn intake_text(plan: &Plan, names: &[&str]) -> String {
    let mut out = String::new();
    let mut line = |label: &str, items: Vec<String>| {
        if !items.is_empty() {
            let _ = writeln!(out, "{label}: {}", items.join(", "));
        }
    };
    line(
        "\nincoming pads dropped",
        plan.semantics
            .iter()
            .filter_map(|(n, s)| {
                let how = match s.incoming.as_ref()? {
                    featshard_spec::ir::IncomingSource::Mask { feature } => {
                        format!("mask `{feature}`")
                    }
                    featshard_spec::ir::IncomingSource::Counts { feature } => {
                        format!("counts `{feature}`")
                    }
                };
                Some(format!("{n} (real items by {how})"))
            })
            .collect(),
    );
    line(
        "map rows without an owner are pads",
        plan.semantics
            .iter()
            .filter(|(_, s)| s.unowned_rows_are_pads)
            .map(|(n, _)| n.clone())
            .collect(),
    );
    let tensors = || names.iter().filter_map(|n| Some((*n, plan.tensor(n)?)));
    line(
        "derived",
        tensors()
            .filter_map(|(n, t)| match t.derived.as_ref()? {
                featshard_spec::ir::DeriveRule::Outer { of: [a, b] } => {
                    Some(format!("{n} = outer({a}, {b})"))
                }
                featshard_spec::ir::DeriveRule::Valid => Some(format!("{n} = valid")),
                featshard_spec::ir::DeriveRule::Halo { of, size } => {
                    Some(format!("{n} = halo({of}, {size} a side)"))
                }
            })
            .collect(),
    );
    line(
        "optional",
        names
            .iter()
            .filter(|n| match plan.features.get(**n) {
                Some(FeaturePlan::Tensor(t)) => t.optional,
                Some(FeaturePlan::Metadata { optional, .. }) => *optional,
                None => false,
            })
            .map(|n| (*n).to_owned())
            .collect(),
    );
    line("dropped keys", plan.inputs.drop.clone());
    let _ = writeln!(out, "other keys: {}", plan.inputs.other_keys.name());
    out
}

/// A local shape; an uneven domain axis lists every rank's extent (`3|3|1`).
fn local_text(plan: &Plan, t: &TensorPlan, s: &FeatureShapes, mesh: Mesh) -> String {
    if !plan.mesh.is_domain() {
        return shape(&s.local_shape);
    }
    let dims: Vec<String> = t
        .axes
        .iter()
        .enumerate()
        .map(|(d, a)| match a.split.mesh_axis() {
            Some(m) if plan.mesh.uneven(m) => chunk_sizes(s.global_shape[d], mesh.size(m))
                .map_or_else(
                    || s.local_shape[d].to_string(),
                    |v| {
                        v.iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("|")
                    },
                ),
            _ => s.local_shape[d].to_string(),
        })
        .collect();
    format!("[{}]", dims.join(", "))
}

fn axes_text(t: &TensorPlan) -> String {
    let items: Vec<String> = t
        .axes
        .iter()
        .map(|a| match (&a.semantic, a.size) {
            (Some(s), _) => s.clone(),
            (None, Some(n)) => n.to_string(),
            (None, None) => "?".into(),
        })
        .collect();
    format!("[{}]", items.join(", "))
}

/// Shapes in terms of semantics (`pad6(tokens)`, `blocks6(atoms)`), as the plan gives
/// them.
fn symbolic_shapes(plan: &Plan, t: &TensorPlan, mesh: Mesh) -> (String, String) {
    let s = plan.symbolic_shapes(t, mesh);
    (extents(&s.global), extents(&s.local))
}
