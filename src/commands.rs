//! The CLI commands, as functions returning what they print, so tests call them too;
//! `explain` has a module of its own (`crate::explain`).

use std::path::{Path, PathBuf};

use featshard_codegen::GeneratedFile;
use featshard_spec::plan::Plan;
use featshard_spec::Mesh;
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
    /// A check's report of what it found (exit 1), printed as it is.
    Findings(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Spec(d) => write!(f, "{}", d.render_plain().trim_end()),
            Failure::Drift(s) | Failure::Other(s) | Failure::Findings(s) => f.write_str(s),
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

/// `featshard validate`: a one-line summary of a valid spec; with samples, each checked
/// against it: what its values show that the spec's declarations contradict
/// ([`crate::findings`]), and whether featshard takes it (intake and every value check,
/// on one rank). Any finding or refusal fails the command with the whole report.
pub fn validate(
    path: &Path,
    samples: &[PathBuf],
    workflow: Option<&str>,
) -> Result<String, Failure> {
    let (spec, plan) = load(path)?;
    let workflows: Vec<&str> = plan.workflows.keys().map(String::as_str).collect();
    let mut report = format!(
        "{}: ok ({} features, {} semantics, workflows: {})",
        path.display(),
        spec.features.len(),
        spec.semantics.len(),
        if workflows.is_empty() {
            "none".to_owned()
        } else {
            workflows.join(", ")
        }
    );
    let mut failed = false;
    for sample in samples {
        let (text, ok) = sample_report(path, (&spec, &plan, workflow), sample)?;
        report.push('\n');
        report.push_str(&text);
        failed |= !ok;
    }
    match failed {
        true => Err(Failure::Findings(report)),
        false => Ok(report),
    }
}

/// One sample checked against a spec: what its values contradict, and whether
/// featshard takes it (why not, when refused). The text and the JSON report both.
pub(crate) fn check_sample(
    (spec, plan, workflow): (&Spec, &Plan, Option<&str>),
    sample: &Path,
) -> Result<(Vec<crate::findings::Finding>, Result<(), String>), String> {
    let values = crate::values::sample(sample)?;
    let findings = crate::findings::check(spec, &values);
    Ok((findings, taken(plan, sample, workflow)))
}

/// One sample against the spec: its findings, then whether featshard takes it.
fn sample_report(
    path: &Path,
    checked: (&Spec, &Plan, Option<&str>),
    sample: &Path,
) -> Result<(String, bool), Failure> {
    let (findings, taken) = check_sample(checked, sample).map_err(Failure::Other)?;
    let mut out = match (findings.len(), &taken) {
        (0, Ok(())) => format!("{}: no findings; taken", sample.display()),
        (0, Err(_)) => format!("{}: no findings; refused", sample.display()),
        (n, _) => format!(
            "{}: {n} finding{} against {}",
            sample.display(),
            if n == 1 { "" } else { "s" },
            path.display()
        ),
    };
    for f in &findings {
        out.push_str("\n  ");
        out.push_str(&f.render(path));
    }
    if let Err(e) = &taken {
        out.push_str(&format!("\n  refused: {e}"));
    }
    Ok((out, findings.is_empty() && taken.is_ok()))
}

/// Whether featshard takes a sample: intake and every value check, placed on one rank.
fn taken(plan: &Plan, sample: &Path, workflow: Option<&str>) -> Result<(), String> {
    let mapped = featshard_exec::files::Mapped::open(sample).map_err(|e| e.to_string())?;
    let mesh = Mesh::single(plan.mesh.axes().len());
    let opts = featshard_exec::Options {
        workflow: workflow.map(str::to_owned),
        ..Default::default()
    };
    featshard_exec::place(plan, mesh, &mapped.sample(), &opts)
        .map(drop)
        .map_err(|e| e.to_string())
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

/// The CP mesh as given on the command line: one size per axis (`8` on a one-axis
/// mesh `(cp,)`, `3x3` on `(cp0, cp1)`) or the axes by name (`cp0=3,cp1=3`). Which it
/// must be is the spec's to say: [`MeshArg::sizes`] reads it for the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshArg(pub String);

impl MeshArg {
    /// The CP mesh for `plan` ([`featshard_spec::plan::MeshPlan::parse`]), refused by
    /// name unless it names the spec's axes; a DP size has no place here (rank files
    /// and pictures are one CP group's).
    pub fn sizes(&self, plan: &Plan) -> Result<Mesh, Failure> {
        let axes = plan.mesh.axes();
        let sizes: Vec<usize> = self
            .0
            .split(['x', 'X'])
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        if !self.0.contains('=') && sizes.len() != axes.len() {
            let e = plan.mesh.matched(&sizes).err().unwrap_or_default();
            return Err(Failure::Other(format!(
                "--mesh {self}: {e}; no DP size here, the command works on one CP group"
            )));
        }
        let shape = plan
            .mesh
            .parse(&self.0)
            .map_err(|e| Failure::Other(format!("--{e}")))?;
        if shape.dp != 1 {
            return Err(Failure::Other(format!(
                "--mesh {self}: a DP size of {} given; the command works on one CP group: give the CP mesh alone ({})",
                shape.dp,
                plan.mesh.named(shape.cp)
            )));
        }
        Ok(shape.cp)
    }
}

impl std::fmt::Display for MeshArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reads a `--mesh` argument's text: sizes joined by `x` (`3x3`, `8`) or `AXIS=SIZE`
/// pairs joined by `,`; each size at least 1. What the axes must be is checked against
/// the spec ([`MeshArg::sizes`]).
pub fn parse_mesh(s: &str) -> Result<MeshArg, String> {
    let sizes: Vec<&str> = if s.contains('=') {
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| p.split_once('=').map_or(p, |(_, n)| n))
            .collect()
    } else {
        s.split(['x', 'X']).collect()
    };
    let bad = sizes
        .iter()
        .find(|p| p.trim().parse::<usize>().ok().filter(|&n| n >= 1).is_none());
    if sizes.is_empty() || bad.is_some() {
        return Err(format!(
            "mesh `{s}`: `{}` is not a size of at least 1; give one size per mesh axis: 3x3 (two axes), 8 (one axis), or the axes by name (cp0=3,cp1=3)",
            bad.unwrap_or(&"")
        ));
    }
    // The world's size, bounded before any spec is read (whatever the axes turn out to be).
    let sizes: Vec<usize> = sizes.iter().filter_map(|p| p.trim().parse().ok()).collect();
    featshard_spec::limits::check_mesh(&sizes)?;
    Ok(MeshArg(s.trim().to_owned()))
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
