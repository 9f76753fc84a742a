//! How ranks agree on a step (`featshard_exec::agree`), for the Python package's
//! collectives: the same votes and status frames the Rust runtime's ranks exchange.

use featshard_exec::agree::{self, Status};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// What every rank of a step must hold the same (the spec, the workflow, the mesh and
/// its rank order, the source's place in its CP group, and what decided its sample).
#[pyclass(name = "Terms", module = "featshard._native", frozen)]
pub struct PyTerms(agree::Terms);

#[pymethods]
impl PyTerms {
    #[new]
    #[pyo3(signature = (spec, workflow, axes, ranks, source = None, sampler = None))]
    fn new(
        spec: &str,
        workflow: Option<&str>,
        axes: Vec<(String, usize)>,
        ranks: Vec<usize>,
        source: Option<usize>,
        sampler: Option<&str>,
    ) -> Self {
        let terms = agree::Terms::new(spec, workflow, &axes, &ranks, source);
        PyTerms(match sampler {
            Some(s) => terms.with_sampler(s),
            None => terms,
        })
    }

    /// The sha256 of everything the terms hold, as the vote compares it.
    #[getter]
    fn digest(&self) -> &str {
        &self.0.digest
    }
}

/// Text from Python as it is, a lone surrogate written as its escape (`\udcff`): an
/// error message may hold bytes no codec decoded (`os.fsdecode`), and it still goes to
/// every rank, naming them.
fn text(s: &Bound<'_, PyString>) -> String {
    if let Ok(text) = s.to_str() {
        return text.to_owned();
    }
    s.call_method1("encode", ("utf-8", "backslashreplace"))
        .and_then(|b| b.extract::<Vec<u8>>())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|_| s.to_string_lossy().into_owned())
}

/// This rank's vote: whether it failed, and its terms' digest (`featshard_exec::agree::vote`).
#[pyfunction]
#[pyo3(signature = (failed, terms = None))]
pub fn vote(failed: bool, terms: Option<&Bound<'_, PyTerms>>) -> Vec<i64> {
    agree::vote(failed, terms.map(|t| &t.get().0)).to_vec()
}

/// Whether the votes reduced by max say every rank succeeded on the same terms.
#[pyfunction]
pub fn unanimous(reduced: Vec<i64>) -> bool {
    agree::unanimous(&reduced)
}

/// The frame of rank `rank`'s outcome: success without `message` (its terms, when
/// given), else its failure (`kind`: the exception's type name). Any text goes in.
#[pyfunction]
#[pyo3(signature = (rank, kind = None, message = None, terms = None))]
pub fn status_frame<'py>(
    py: Python<'py>,
    rank: usize,
    kind: Option<&Bound<'py, PyString>>,
    message: Option<&Bound<'py, PyString>>,
    terms: Option<&Bound<'py, PyTerms>>,
) -> Bound<'py, PyBytes> {
    let status = match message {
        None => Status::Ok,
        Some(message) => Status::Rank {
            rank,
            kind: kind.map(text),
            message: text(message),
        },
    };
    let frame = agree::frame_of(rank, &status, terms.map(|t| &t.get().0));
    PyBytes::new(py, &frame.encode())
}

/// The failure a frame holds, `(kind, message, rank)` (a source's failure and a
/// disagreement have kind `FeatureDistributionError`; a disagreement has no rank), or
/// `None` for success; `ValueError` for bytes no rank wrote.
#[pyfunction]
pub fn read_status(frame: &[u8]) -> PyResult<Option<(String, String, Option<usize>)>> {
    let status = Status::decode(frame).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err("a status frame no featshard rank wrote")
    })?;
    Ok(failure(status))
}

/// The one outcome of every rank's frames, in rank order (`featshard_exec::agree::verdict`):
/// `None` for success, else `(kind, message, rank)` as [`read_status`] gives it.
#[pyfunction]
pub fn verdict(frames: Vec<Vec<u8>>) -> Option<(String, String, Option<usize>)> {
    let decoded: Vec<Option<Status>> = frames.iter().map(|f| Status::decode(f)).collect();
    failure(agree::verdict(&decoded))
}

fn failure(status: Status) -> Option<(String, String, Option<usize>)> {
    let distribution = || "FeatureDistributionError".to_owned();
    match status {
        Status::Ok | Status::Terms { .. } => None,
        Status::Rank {
            rank,
            kind,
            message,
        } => Some((kind.unwrap_or_else(distribution), message, Some(rank))),
        Status::Source { rank, message, .. } => Some((distribution(), message, Some(rank))),
        Status::Disagree { message } => Some((distribution(), message, None)),
    }
}
