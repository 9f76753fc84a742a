//! Windows of a safetensors file's tensors read straight into tensors' memory
//! (`featshard_exec::files::read_window`): each domain rank reads only its own part of
//! a serial sample, positioned reads, no memory map, no whole tensor.

use std::collections::BTreeMap;
use std::path::PathBuf;

use featshard_exec::files::{self, Header};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::dlpack::Memory;

/// One safetensors file, its header read and checked, open for window reads.
#[pyclass(frozen, module = "featshard._native")]
pub(crate) struct WindowReader {
    path: PathBuf,
    file: std::fs::File,
    header: Header,
}

#[pymethods]
impl WindowReader {
    /// Opens the file at `path` and checks its header; `ValueError` naming the file.
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<WindowReader> {
        let err = |e: featshard_exec::ExecError| PyValueError::new_err(e.to_string());
        let header = py.detach(|| files::read_header(&path)).map_err(err)?;
        let file = files::open_regular(&path).map_err(err)?;
        Ok(WindowReader { path, file, header })
    }

    /// Every tensor's dtype name and shape, by name.
    #[getter]
    fn tensors(&self) -> BTreeMap<String, (&'static str, Vec<usize>)> {
        let entries = self.header.entries.iter();
        entries
            .map(|e| (e.name.clone(), (e.dtype.name(), e.shape.clone())))
            .collect()
    }

    /// Reads `window` (`(start, stop)` per axis) of tensor `name` into `out`, the DLPack
    /// capsule of a contiguous CPU tensor of the window's shape and the tensor's dtype.
    fn read(
        &self,
        py: Python<'_>,
        name: &str,
        window: Vec<(usize, usize)>,
        out: Bound<'_, PyCapsule>,
    ) -> PyResult<()> {
        let entry = self.header.entries.iter().find(|e| e.name == name);
        let entry = entry.ok_or_else(|| {
            PyValueError::new_err(format!("{}: no tensor `{name}`", self.path.display()))
        })?;
        let mut memory = Memory::new(name, &out)?;
        if memory.dtype != entry.dtype {
            return Err(PyValueError::new_err(format!(
                "feature `{name}`: a {} tensor for its {} window",
                memory.dtype.name(),
                entry.dtype.name()
            )));
        }
        let (start, bytes) = (self.header.data_start, memory.bytes_mut());
        py.detach(|| files::read_window((&self.file, &self.path), start, entry, &window, bytes))
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}
