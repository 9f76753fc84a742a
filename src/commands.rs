//! The CLI commands, as functions returning what they print, so tests call them too.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use featshard_codegen::GeneratedFile;
use featshard_exec::compact::{stored_form, Form, ENTRY_BYTES};
use featshard_spec::plan::CP_AXES;
use featshard_spec::plan::{
    chunk_sizes, FeaturePlan, FeatureShapes, Lengths, Padding, Plan, ResolveError, Resolved,
    TensorPlan,
};
use featshard_spec::{Diagnostics, Spec};

/// A command failure and the exit code it maps to.
#[derive(Debug)]
pub enum Failure {
    /// The spec is invalid (exit 1).
    Spec(Diagnostics),
    /// Generated files are missing or stale (exit 1).
    Drift(String),
    /// Anything else: I/O, bad run-time input (exit 1).
    Other(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Spec(d) => write!(f, "{}", d.render_plain().trim_end()),
            Failure::Drift(s) | Failure::Other(s) => f.write_str(s),
        }
    }
}

/// Loads and plans a spec file. Generated headers name the file, not its path, so
/// output does not depend on the working directory.
pub fn load(path: &Path) -> Result<(Spec, Plan), Failure> {
    let (spec, mut plan) = featshard_spec::compile_file(path).map_err(Failure::Spec)?;
    if let Some(file) = path.file_name() {
        plan.source.name = file.to_string_lossy().into_owned();
    }
    Ok((spec, plan))
}

/// `featshard validate`: a one-line summary of a valid spec.
pub fn validate(path: &Path) -> Result<String, Failure> {
    let (spec, plan) = load(path)?;
    let workflows: Vec<&str> = plan.workflows.keys().map(String::as_str).collect();
    Ok(format!(
        "{}: ok ({} features, {} semantics, workflows: {})",
        path.display(),
        spec.features.len(),
        spec.semantics.len(),
        if workflows.is_empty() {
            "none".to_owned()
        } else {
            workflows.join(", ")
        }
    ))
}

/// Every file generated for a spec.
pub fn render(path: &Path) -> Result<Vec<GeneratedFile>, Failure> {
    render_with(path, false)
}

/// Every file generated for a spec, with the pytest parity test when `tests`.
pub fn render_with(path: &Path, tests: bool) -> Result<Vec<GeneratedFile>, Failure> {
    let (_, plan) = load(path)?;
    let mut files =
        featshard_codegen::generate(&plan).map_err(|e| Failure::Other(e.to_string()))?;
    if tests {
        files.push(
            featshard_codegen::generate_tests(&plan).map_err(|e| Failure::Other(e.to_string()))?,
        );
    }
    Ok(files)
}

/// `featshard generate`: writes every generated file into `out`, all or nothing. Every
/// file is written first into a private staging folder made for this run (created
/// exclusively, so nothing planted there is followed), then each is renamed into
/// place; a failure before the renames leaves `out` as it was. Returns the paths.
pub fn generate(path: &Path, out: &Path, tests: bool) -> Result<Vec<PathBuf>, Failure> {
    let files = render_with(path, tests)?;
    let fail = |what: &str, p: &Path, e: std::io::Error| {
        Failure::Other(format!("cannot {what} {}: {e}", p.display()))
    };
    std::fs::create_dir_all(out).map_err(|e| fail("create", out, e))?;
    // What would make a rename fail is refused before any file is replaced.
    if let Some(f) = files.iter().find(|f| out.join(&f.name).is_dir()) {
        return Err(Failure::Other(format!(
            "cannot write {}: a directory is in the way",
            out.join(&f.name).display()
        )));
    }
    let staging = tempfile::Builder::new()
        .prefix(".featshard-staging-")
        .tempdir_in(out)
        .map_err(|e| fail("stage files in", out, e))?;
    for f in &files {
        let tmp = staging.path().join(&f.name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut file| std::io::Write::write_all(&mut file, f.contents.as_bytes()))
            .map_err(|e| fail("write", &out.join(&f.name), e))?;
    }
    let mut written = Vec::new();
    for f in &files {
        let dest = out.join(&f.name);
        std::fs::rename(staging.path().join(&f.name), &dest)
            .map_err(|e| fail("write", &dest, e))?;
        written.push(dest);
    }
    Ok(written)
}

/// `featshard check`: fails naming every generated file that is missing or stale.
pub fn check(path: &Path, out: &Path) -> Result<String, Failure> {
    // A parity test generated with `--tests` is checked too when it is there.
    let (_, plan) = load(path)?;
    let tests = out.join(format!("test_{}_parity.py", plan.module)).exists();
    let files = render_with(path, tests)?;
    let mut problems = Vec::new();
    for f in &files {
        let dest = out.join(&f.name);
        // Read as a regular file only: a FIFO there is named, never waited on.
        let read = featshard_exec::files::open_regular(&dest).and_then(|mut file| {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut file, &mut text)
                .map(|_| text)
                .map_err(|e| featshard_exec::ExecError::Io {
                    path: dest.display().to_string(),
                    message: e.to_string(),
                })
        });
        match read {
            Ok(text) if text == f.contents => {}
            Ok(_) => problems.push(format!("stale: {}", dest.display())),
            Err(_) if dest.exists() => {
                problems.push(format!("not a regular file: {}", dest.display()))
            }
            Err(_) => problems.push(format!("missing: {}", dest.display())),
        }
    }
    if problems.is_empty() {
        Ok(format!(
            "{}: {} generated files up to date",
            out.display(),
            files.len()
        ))
    } else {
        Err(Failure::Drift(format!(
            "{}\nrun `featshard generate {} --out {}` and commit the result",
            problems.join("\n"),
            path.display(),
            out.display()
        )))
    }
}

/// Mesh sizes as given on the command line, one per axis: `8` for a one-axis CP mesh
/// `(cp,)` or a one-axis domain mesh, `3x3` for `(cp0, cp1)`. Which it must be is the
/// spec's to say: [`MeshArg::sizes`] checks it against the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshArg(pub Vec<usize>);

impl MeshArg {
    /// The sizes as the two axes geometry takes, refused by name unless the plan's
    /// mesh has one axis per size.
    pub fn sizes(&self, plan: &Plan) -> Result<[usize; CP_AXES], Failure> {
        plan.mesh_sizes(&self.0)
            .map_err(|e| Failure::Other(format!("--mesh {self}: {e}")))
    }
}

impl std::fmt::Display for MeshArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join("x"))
    }
}

/// Parses `3x3` (two axes) or `8` (one axis) into mesh sizes of at least 1 each.
pub fn parse_mesh(s: &str) -> Result<MeshArg, String> {
    let parts: Vec<&str> = s.split(['x', 'X']).collect();
    if !(1..=CP_AXES).contains(&parts.len()) {
        return Err(format!(
            "mesh `{s}`: expected one size per mesh axis: CP0xCP1 (3x3, 2x3) for a two-axis mesh, one size (8) for a one-axis mesh"
        ));
    }
    let sizes = parts
        .iter()
        .map(|p| match p.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!("mesh `{s}`: `{p}` is not a size of at least 1")),
        })
        .collect::<Result<Vec<usize>, String>>()?;
    let two = featshard_spec::layout::two_axes(&sizes, 1).unwrap_or([1; CP_AXES]);
    featshard_spec::limits::check_mesh(&two)?;
    Ok(MeshArg(sizes))
}

/// Parses `tokens=2048,atoms=20000` into semantic lengths.
pub fn parse_lengths(s: &str) -> Result<Vec<(String, usize)>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("length `{p}`: expected SEMANTIC=N"))?;
            let n = v
                .trim()
                .parse::<usize>()
                .map_err(|_| format!("length `{p}`: `{v}` is not a non-negative integer"))?;
            featshard_spec::limits::check_length(k.trim(), n)?;
            Ok((k.trim().to_owned(), n))
        })
        .collect()
}

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
    mesh: [usize; CP_AXES],
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
    mesh: [usize; CP_AXES],
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
    mesh: [usize; CP_AXES],
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
    let sizes: Vec<String> = mesh[..plan.mesh.axes().len().min(CP_AXES)]
        .iter()
        .map(ToString::to_string)
        .collect();
    let mut out = format!(
        "mesh ({}) = ({}): {} {} ranks{}\n\n",
        plan.mesh.axes().join(", "),
        sizes.join(", "),
        mesh[0] * mesh[1],
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

/// A feature's bytes at its padded global shape, dense and in its compact form (a
/// one-hot feature or map as indices, a mask as bits, a ranged feature narrowed; the
/// others as they are). A sparse feature's compact bytes depend on its values: `None`.
/// Counted in `u128`, saturating: `explain` takes any length, and a count past memory
/// is shown as large, never wrapped to a small one.
fn feature_bytes(t: &TensorPlan, global: &[usize]) -> (u128, Option<u128>) {
    let bytes = |shape: &[usize], d| {
        shape
            .iter()
            .fold(featshard_exec::dtype::size(d) as u128, |n, &k| {
                n.saturating_mul(k as u128)
            })
    };
    let dense = bytes(global, t.dtype);
    let compact = match stored_form(t, global, 0) {
        Some((Form::Sparse, _, _)) => None,
        Some((_, d, shape)) => Some(bytes(&shape, d)),
        None => Some(dense),
    };
    (dense, compact)
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

/// The bytes of features at these shapes: dense, compact (sparse features left out, their
/// bytes depend on values) and how many sparse features there are.
pub(crate) fn total_bytes<'a>(
    plan: &Plan,
    shapes: impl Iterator<Item = (&'a str, &'a [usize])>,
) -> (u128, u128, usize) {
    let (mut dense, mut compact, mut sparse) = (0u128, 0u128, 0usize);
    for (name, shape) in shapes {
        let Some(t) = plan.tensor(name) else { continue };
        let (d, c) = feature_bytes(t, shape);
        dense = dense.saturating_add(d);
        match c {
            Some(c) => compact = compact.saturating_add(c),
            None => sparse += 1,
        }
    }
    (dense, compact, sparse)
}

/// Bytes for people: B, KB, MB, GB, TB, PB (powers of 1000); past that in powers of ten.
pub(crate) fn human(n: u128) -> String {
    let units = [
        ("PB", 1e15),
        ("TB", 1e12),
        ("GB", 1e9),
        ("MB", 1e6),
        ("KB", 1e3),
    ];
    let x = n as f64;
    if x >= 1e18 {
        return format!("{x:.2e} B");
    }
    match units.iter().find(|(_, u)| x >= *u) {
        Some((name, u)) => format!("{:.2} {name}", x / u),
        None => format!("{n} B"),
    }
}

/// One feature's row of `explain`'s table.
fn feature_row(
    plan: &Plan,
    mesh: [usize; CP_AXES],
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
fn local_text(plan: &Plan, t: &TensorPlan, s: &FeatureShapes, mesh: [usize; 2]) -> String {
    if !plan.mesh.is_domain() {
        return shape(&s.local_shape);
    }
    let dims: Vec<String> = t
        .axes
        .iter()
        .enumerate()
        .map(|(d, a)| match a.split.mesh_axis() {
            Some(m) if plan.mesh.uneven(m) => chunk_sizes(s.global_shape[d], mesh[m]).map_or_else(
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

pub(crate) fn explain_lengths(
    plan: &Plan,
    given: &[(String, usize)],
    notes: &mut Vec<String>,
) -> Result<Lengths, Failure> {
    let mut l = Lengths::default();
    for (k, v) in given {
        if !plan.semantics.contains_key(k) {
            return Err(Failure::Other(format!(
                "--lengths: semantic `{k}` is not declared in the spec"
            )));
        }
        l.sizes.insert(k.clone(), *v);
    }
    // Owner counts are per sample; explain spreads items evenly over their root owners.
    for (name, s) in &plan.semantics {
        let Padding::OwnerBlocks { root, .. } = &s.padding else {
            continue;
        };
        if !l.sizes.contains_key(name) || !l.sizes.contains_key(root) {
            continue;
        }
        l.counts
            .insert(name.clone(), featshard_spec::plan::RootCounts::Even);
        notes.push(format!(
            "{name} assumed spread evenly over {root}; real samples pad to their largest block"
        ));
    }
    Ok(l)
}

pub(crate) fn shape(s: &[usize]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )
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
fn symbolic_shapes(plan: &Plan, t: &TensorPlan, mesh: [usize; CP_AXES]) -> (String, String) {
    let s = plan.symbolic_shapes(t, mesh);
    (extents(&s.global), extents(&s.local))
}

pub(crate) fn extents(e: &[featshard_spec::plan::Extent]) -> String {
    let items: Vec<String> = e.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(", "))
}

fn table(rows: &[Vec<String>]) -> String {
    let mut widths = vec![0usize; rows.first().map_or(0, Vec::len)];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, &w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
        if i == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            let _ = writeln!(out, "{}", rule.join("  "));
        }
    }
    out
}

/// `featshard schema`: the JSON Schema of spec files (or of plan.json).
pub fn schema(plan: bool) -> String {
    let value = if plan {
        featshard_spec::plan::json_schema()
    } else {
        featshard_spec::syntax::json_schema()
    };
    let mut s = serde_json::to_string_pretty(&value).unwrap_or_default();
    s.push('\n');
    s
}
