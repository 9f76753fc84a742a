//! `featshard validate --format json`: the report as one JSON document for the programs
//! that drive featshard (CI, editors, agents), from the same values the text report
//! prints. Its schema is `schema/validate-report.schema.json` (`featshard schema
//! --report validate`), versioned by [`VERSION`].

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Serialize;

use featshard_spec::Diagnostics;

use crate::commands::{check_sample, load, Failure};
use crate::findings::Finding;

/// The report format's version: a change that breaks a reader raises it.
pub const VERSION: u32 = 1;

/// What `validate` found: the spec's errors, or its summary and each sample's check.
#[derive(Serialize, JsonSchema)]
pub struct ValidateReport {
    /// [`VERSION`].
    pub version: u32,
    /// The spec file as given.
    pub spec: String,
    /// Whether everything passed: the spec is valid, no sample has a finding and every
    /// sample is taken (the exit code is 0 exactly then).
    pub ok: bool,
    /// The spec's summary, when it is valid.
    pub summary: Option<Summary>,
    /// Every error of an invalid spec, in the order the text report lists them.
    pub diagnostics: Vec<Diagnostic>,
    /// Each sample checked against the spec (`--features`), in the order given.
    pub samples: Vec<SampleReport>,
}

/// A valid spec, counted.
#[derive(Serialize, JsonSchema)]
pub struct Summary {
    /// Features declared.
    pub features: usize,
    /// Semantics declared.
    pub semantics: usize,
    /// Workflows declared.
    pub workflows: Vec<String>,
}

/// One error of a spec, where it was written.
#[derive(Serialize, JsonSchema)]
pub struct Diagnostic {
    /// Always `error`: a spec with one is refused.
    pub severity: &'static str,
    /// What is wrong.
    pub message: String,
    /// The feature it is about.
    pub feature: Option<String>,
    /// The axis of that feature (its position).
    pub axis: Option<usize>,
    /// The semantic it is about.
    pub semantic: Option<String>,
    /// 1-based line in the spec, when the error is at a place in its text.
    pub line: Option<u32>,
    /// 1-based column.
    pub column: Option<u32>,
    /// How to fix it, when there is one obvious way.
    pub help: Option<String>,
}

/// One sample checked against the spec.
#[derive(Serialize, JsonSchema)]
pub struct SampleReport {
    /// The sample file as given.
    pub path: String,
    /// Every declaration its values contradict.
    pub findings: Vec<FindingReport>,
    /// Whether featshard takes the sample (intake and every value check).
    pub taken: bool,
    /// Why not, when it is refused.
    pub refused: Option<String>,
}

/// One declaration a sample's values contradict.
#[derive(Serialize, JsonSchema)]
pub struct FindingReport {
    /// The feature declared.
    pub feature: String,
    /// 1-based line of its declaration.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
    /// What the values show.
    pub shows: String,
    /// The declaration to consider.
    pub consider: String,
}

impl From<&Finding> for FindingReport {
    fn from(f: &Finding) -> Self {
        FindingReport {
            feature: f.feature.clone(),
            line: f.at.line,
            column: f.at.column,
            shows: f.shows.clone(),
            consider: f.consider.clone(),
        }
    }
}

/// Every error of an invalid spec as reported.
pub fn diagnostics(d: &Diagnostics) -> Vec<Diagnostic> {
    d.errors
        .iter()
        .map(|e| {
            let known = e.loc.is_known();
            Diagnostic {
                severity: "error",
                message: e.message.clone(),
                feature: e.feature.clone(),
                axis: e.axis.as_ref().map(|a| a.index),
                semantic: e.semantic.clone(),
                line: known.then_some(e.loc.line),
                column: known.then_some(e.loc.column),
                help: e.help.clone(),
            }
        })
        .collect()
}

/// The JSON Schema of [`ValidateReport`], as `featshard schema --report validate` prints it.
pub fn validate_schema() -> String {
    let schema = schemars::schema_for!(ValidateReport);
    let mut s = serde_json::to_string_pretty(&schema).unwrap_or_default();
    s.push('\n');
    s
}

/// `featshard validate --format json`: the report on stdout, exit 1 unless it is `ok`
/// (as the text report's). A sample that cannot be read is refused in the report.
pub fn validate_json(
    path: &Path,
    samples: &[PathBuf],
    workflow: Option<&str>,
) -> Result<String, Failure> {
    let mut report = ValidateReport {
        version: VERSION,
        spec: path.display().to_string(),
        ok: true,
        summary: None,
        diagnostics: Vec::new(),
        samples: Vec::new(),
    };
    match load(path) {
        Err(Failure::Spec(d)) => report.diagnostics = diagnostics(&d),
        Err(e) => return Err(e),
        Ok((spec, plan)) => {
            report.summary = Some(Summary {
                features: spec.features.len(),
                semantics: spec.semantics.len(),
                workflows: plan.workflows.keys().cloned().collect(),
            });
            for sample in samples {
                let checked = check_sample((&spec, &plan, workflow), sample);
                let (findings, taken) = checked.unwrap_or_else(|e| (Vec::new(), Err(e)));
                report.samples.push(SampleReport {
                    path: sample.display().to_string(),
                    findings: findings.iter().map(FindingReport::from).collect(),
                    taken: taken.is_ok(),
                    refused: taken.err(),
                });
            }
        }
    }
    report.ok = report.diagnostics.is_empty()
        && report
            .samples
            .iter()
            .all(|s| s.taken && s.findings.is_empty());
    let text = serde_json::to_string_pretty(&report).map_err(|e| Failure::Other(e.to_string()))?;
    match report.ok {
        true => Ok(text),
        false => Err(Failure::Findings(text)),
    }
}
