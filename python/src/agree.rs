//! The status frame ranks exchange to agree on a step's outcome
//! (`featshard_exec::agree`), for the Python package's collectives: the same bytes the
//! Rust runtime's ranks exchange.

use featshard_exec::agree::Status;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The frame of rank `rank`'s outcome: success without `message`, else its failure
/// (`kind`: the exception's type name).
#[pyfunction]
#[pyo3(signature = (rank, kind = None, message = None))]
pub fn status_frame<'py>(
    py: Python<'py>,
    rank: usize,
    kind: Option<String>,
    message: Option<String>,
) -> Bound<'py, PyBytes> {
    let status = match message {
        None => Status::Ok,
        Some(message) => Status::Rank {
            rank,
            kind,
            message,
        },
    };
    PyBytes::new(py, &status.encode())
}

/// The failure a frame holds, `(kind, message, rank)` (a source's failure has kind
/// `FeatureDistributionError`), or `None` for success; `ValueError` for bytes no rank
/// wrote.
#[pyfunction]
pub fn read_status(frame: &[u8]) -> PyResult<Option<(String, String, usize)>> {
    match Status::decode(frame) {
        Some(Status::Ok) => Ok(None),
        Some(Status::Rank {
            rank,
            kind,
            message,
        }) => Ok(Some((
            kind.unwrap_or_else(|| "FeatureDistributionError".to_owned()),
            message,
            rank,
        ))),
        Some(Status::Source { rank, message, .. }) => {
            Ok(Some(("FeatureDistributionError".to_owned(), message, rank)))
        }
        None => Err(PyValueError::new_err(
            "a status frame no featshard rank wrote",
        )),
    }
}
