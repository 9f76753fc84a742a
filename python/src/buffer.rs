//! The executor's rank-buffer contract (`featshard_exec::buffer`) as typed Python
//! objects: a source's layout of every rank's buffer, what each slot holds, and how a
//! compact slot expands. Python reads every offset, shape and form from these; it
//! computes none of them.

use std::sync::Arc;

use featshard_exec::buffer;
use featshard_exec::compact::Form;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Every slot of a rank's buffer, and the buffer's length.
#[pyclass(frozen, module = "featshard._native")]
pub(crate) struct BufferLayout {
    pub(crate) layout: Arc<buffer::BufferLayout>,
}

/// One slot of a rank's buffer.
#[pyclass(frozen, module = "featshard._native")]
pub(crate) struct Slot {
    pub(crate) slot: buffer::Slot,
}

impl BufferLayout {
    pub(crate) fn new(layout: buffer::BufferLayout) -> BufferLayout {
        BufferLayout {
            layout: Arc::new(layout),
        }
    }
}

#[pymethods]
impl BufferLayout {
    /// The slots, in buffer order.
    #[getter]
    fn slots(&self) -> Vec<Slot> {
        let slot = |s: &buffer::Slot| Slot { slot: s.clone() };
        self.layout.slots.iter().map(slot).collect()
    }

    /// Bytes of every rank's buffer.
    #[getter]
    fn nbytes(&self) -> usize {
        self.layout.bytes
    }

    /// Bytes the compact slots' dense blocks take, each aligned.
    #[getter]
    fn expanded_bytes(&self) -> usize {
        self.layout.expanded_bytes()
    }

    /// The slot of feature `name`, if the buffer holds it.
    fn slot(&self, name: &str) -> Option<Slot> {
        self.layout.slot(name).map(|s| Slot { slot: s.clone() })
    }

    /// The header bytes a source sends for this layout.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.layout.to_bytes())
    }

    /// A layout read back from a source's header bytes; `ValueError` when they are not
    /// one whose slots lie inside the buffer.
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> PyResult<BufferLayout> {
        buffer::BufferLayout::from_bytes(data)
            .map(BufferLayout::new)
            .map_err(PyValueError::new_err)
    }

    fn __len__(&self) -> usize {
        self.layout.slots.len()
    }
}

#[pymethods]
impl Slot {
    /// The feature's name.
    #[getter]
    fn name(&self) -> &str {
        &self.slot.name
    }

    /// The dtype the buffer holds here (a compact block's when compact).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.slot.dtype.name()
    }

    /// The shape the buffer holds here.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.slot.shape.clone()
    }

    /// Byte offset in the buffer.
    #[getter]
    fn offset(&self) -> usize {
        self.slot.offset
    }

    /// Bytes the buffer holds here.
    #[getter]
    fn nbytes(&self) -> usize {
        self.slot.nbytes()
    }

    /// The DTensor's global shape; `None` for a passed-through feature.
    #[getter]
    fn global_shape(&self) -> Option<Vec<usize>> {
        self.slot.global.as_ref().map(|g| g.shape.clone())
    }

    /// The compact form's name (`one_hot`, `bits`, `sparse`, `narrow`); `None` for a
    /// block held as it is.
    #[getter]
    fn form(&self) -> Option<&'static str> {
        self.slot.compact.as_ref().map(|e| e.form.name())
    }

    /// A one-hot block's one-hot axis and class count (its block's length of it, for a
    /// map); `None` for any other slot.
    #[getter]
    fn one_hot(&self) -> Option<(usize, usize)> {
        match self.slot.compact.as_ref()?.form {
            Form::OneHot { axis, classes, .. } => Some((axis, classes)),
            _ => None,
        }
    }

    /// The dtype of the block the model takes.
    #[getter]
    fn dense_dtype(&self) -> &'static str {
        self.slot.dense().0.name()
    }

    /// The shape of the block the model takes.
    #[getter]
    fn dense_shape(&self) -> Vec<usize> {
        self.slot.dense().1.to_vec()
    }

    /// Bytes of the block the model takes.
    #[getter]
    fn dense_nbytes(&self) -> usize {
        self.slot.dense_nbytes()
    }

    fn __repr__(&self) -> String {
        let s = &self.slot;
        format!(
            "Slot({:?}, {} {:?} at {}, form {})",
            s.name,
            s.dtype.name(),
            s.shape,
            s.offset,
            s.compact.as_ref().map_or("none", |e| e.form.name())
        )
    }
}
