//! `explain`'s topology table: for one sample's lengths, each rank's bytes on a one-axis
//! CP mesh of P ranks and on every 2-D tile of P ranks, side by side. Each topology is
//! the same spec with its `mesh:` line changed in memory, through the same inference, so
//! a user can pick a topology for a sample size before any byte moves.

use std::fmt::Write as _;

use featshard_spec::ir::{MeshSplit, Named, Spec};
use featshard_spec::loc::Loc;
use featshard_spec::Mesh;
use featshard_spec::Plan;

use crate::sizes::{explain_lengths, total_bytes};
use crate::text::human;

/// One topology of `ranks` ranks: its label, mesh sizes and the plan it gets.
struct Topology {
    label: String,
    mesh: Mesh,
    plan: Result<Plan, String>,
}

/// The table, or `None` for a domain-parallel spec (its meshes are not CP topologies).
pub fn table(
    spec: &Spec,
    plan: &Plan,
    mesh: Mesh,
    given: &[(String, usize)],
    workflow: Option<&str>,
) -> Option<String> {
    if plan.mesh.is_domain() {
        return None;
    }
    let ranks = mesh.ranks();
    let mut out = format!(
        "\neach rank's bytes for these lengths on every CP topology of {ranks} ranks (the same spec, its mesh line changed):\n"
    );
    let mut rows =
        vec![["topology", "dense per rank", "compact per rank", "note"].map(str::to_owned)];
    for t in topologies(spec, plan, ranks) {
        let this = t.mesh == mesh
            && t.plan
                .as_ref()
                .is_ok_and(|p| p.mesh.axes() == plan.mesh.axes());
        let (dense, compact, note) = match &t.plan {
            Ok(p) => match per_rank(p, t.mesh, given, workflow) {
                Ok((d, c, sparse)) => (human(d), compact_text(c, sparse), String::new()),
                Err(e) => ("-".into(), "-".into(), e),
            },
            Err(e) => ("-".into(), "-".into(), format!("not placeable: {e}")),
        };
        let note = match (this, note.is_empty()) {
            (true, true) => "this spec".to_owned(),
            (true, false) => format!("this spec; {note}"),
            (false, _) => note,
        };
        rows.push([t.label, dense, compact, note]);
    }
    let widths: Vec<usize> = (0..4)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    Some(out)
}

/// `(cp,)` of `ranks`, then every tile `a x b` with `a * b = ranks` (`ranks` a mesh's,
/// so each is a mesh within the limits).
fn topologies(spec: &Spec, plan: &Plan, ranks: usize) -> Vec<Topology> {
    let one = with_axes(spec, plan, &["cp"]);
    let two = with_axes(spec, plan, &["cp0", "cp1"]);
    let tiles = (1..=ranks).filter(|a| ranks % a == 0).map(|a| {
        let label = format!("(cp0, cp1) = ({a}, {})", ranks / a);
        (label, vec![a, ranks / a], two.clone())
    });
    std::iter::once((format!("(cp,) = ({ranks})"), vec![ranks], one))
        .chain(tiles)
        .filter_map(|(label, sizes, plan)| {
            let mesh = Mesh::new(&sizes).ok()?;
            Some(Topology { label, mesh, plan })
        })
        .collect()
}

/// The plan of `spec` on a CP mesh of these axes: the spec's own names where it has as
/// many axes, these otherwise.
fn with_axes(spec: &Spec, plan: &Plan, names: &[&str]) -> Result<Plan, String> {
    if plan.mesh.axes().len() == names.len() {
        return Ok(plan.clone());
    }
    let mut spec = spec.clone();
    spec.mesh.split = MeshSplit::Cp(names.iter().map(|n| Named::new(*n, Loc::UNKNOWN)).collect());
    featshard_spec::plan::plan(&spec).map_err(|errors| {
        errors
            .first()
            .map_or_else(|| "no plan".to_owned(), |e| e.to_string())
    })
}

/// One rank's bytes (every rank's block has the same shape on a CP mesh): dense,
/// compact (sparse features not counted) and how many sparse features there are.
fn per_rank(
    plan: &Plan,
    mesh: Mesh,
    given: &[(String, usize)],
    workflow: Option<&str>,
) -> Result<(u128, u128, usize), String> {
    let lengths = explain_lengths(plan, given, &mut Vec::new()).map_err(|e| e.to_string())?;
    let resolved = plan
        .resolve(mesh, &lengths, workflow)
        .map_err(|e| e.to_string())?;
    let shapes = resolved
        .features
        .iter()
        .map(|(n, s)| (n.as_str(), s.local_shape.as_slice()));
    Ok(total_bytes(plan, shapes))
}

fn compact_text(bytes: u128, sparse: usize) -> String {
    match sparse {
        0 => human(bytes),
        n => format!("{} + {n} sparse", human(bytes)),
    }
}
