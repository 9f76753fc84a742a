//! Collate's plan (`featshard_exec::collate`) for the package's `collate`: the frame a
//! DP replica all-reduces by max, and the target local shapes read from it reduced.

use std::collections::BTreeMap;

use featshard_exec::collate;
use pyo3::prelude::*;

/// What one DP replica all-reduces by max over the DP group, and reads back reduced.
#[pyclass(frozen, module = "featshard._native")]
pub(crate) struct CollateFrame {
    pub(crate) frame: collate::CollateFrame,
}

#[pymethods]
impl CollateFrame {
    /// The features this replica's batch holds, sorted.
    #[getter]
    fn names(&self) -> Vec<String> {
        self.frame.names.clone()
    }

    /// The values to all-reduce by max (a length the plan fixes).
    #[getter]
    fn frame(&self) -> Vec<i64> {
        self.frame.frame.clone()
    }
}

/// The frame of a batch of samples given as each one's blocks' local shapes.
pub(crate) fn frame(
    plan: &featshard_spec::plan::Plan,
    samples: &[BTreeMap<String, Vec<usize>>],
    others: &[collate::Others],
) -> Result<CollateFrame, featshard_exec::ExecError> {
    collate::collate_frame(plan, samples, others).map(|frame| CollateFrame { frame })
}
