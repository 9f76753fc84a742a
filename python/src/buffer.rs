//! The executor's rank-buffer contract (`featshard_exec::buffer`) as typed Python
//! objects: a source's layout of every rank's buffer, what each slot holds, and how a
//! compact slot expands. Python reads every offset, shape and form from these; it
//! computes none of them.

use std::sync::Arc;

use featshard_exec::compact::{self, Table};
use featshard_exec::{buffer, header};
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

/// A step's header: the sample, its layout, every rank's buffer
/// (`featshard_exec::header`).
#[pyclass(frozen, module = "featshard._native")]
pub(crate) struct Header {
    header: header::Header,
}

impl Header {
    pub(crate) fn new(header: header::Header) -> Header {
        Header { header }
    }
}

#[pymethods]
impl Header {
    /// The sample's index in the serial dataset, where the source gave it.
    #[getter]
    fn sample(&self) -> Option<usize> {
        self.header.sample
    }

    /// The sample's layout on the mesh.
    #[getter]
    fn layout(&self) -> crate::tables::Layout {
        crate::tables::Layout {
            layout: self.header.layout.clone(),
        }
    }

    /// Every rank's buffer.
    #[getter]
    fn buffer(&self) -> BufferLayout {
        BufferLayout::new(self.header.buffer.clone())
    }

    /// The bytes a source sends.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self
            .header
            .to_bytes()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// A header read back from a source's bytes; `ValueError` when they are not one
    /// whose slots lie inside the buffer.
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> PyResult<Header> {
        header::Header::from_bytes(data)
            .map(Header::new)
            .map_err(PyValueError::new_err)
    }
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

    /// How a passed-through value that is not a tensor was encoded (`pickle`); `None`
    /// for a tensor.
    #[getter]
    fn encoding(&self) -> Option<&str> {
        self.slot.encoding.as_deref()
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

    /// How torch makes a compact block's dense block (the executor's recipe); `None`
    /// for a block held as it is.
    #[getter]
    fn recipe(&self) -> Option<Recipe> {
        let recipe = self.slot.compact.as_ref()?.recipe();
        Some(Recipe { recipe })
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

/// The tensor operations that make a compact block's dense block
/// (`featshard_exec::compact::Recipe`), for torch to run as they are stated: `op` names
/// the operation, and the other fields are those it has (`None` otherwise).
#[pyclass(frozen, module = "featshard._native")]
pub(crate) struct Recipe {
    recipe: compact::Recipe,
}

impl Recipe {
    fn table_of(&self) -> Option<&Table> {
        match &self.recipe {
            compact::Recipe::Rows { table, .. } => Some(table),
            _ => None,
        }
    }
}

#[pymethods]
impl Recipe {
    /// `rows`, `scatter`, `entries` or `cast`.
    #[getter]
    fn op(&self) -> &'static str {
        match self.recipe {
            compact::Recipe::Rows { .. } => "rows",
            compact::Recipe::Scatter { .. } => "scatter",
            compact::Recipe::Entries { .. } => "entries",
            compact::Recipe::Cast => "cast",
        }
    }

    /// `rows`: the name that tells its table from another (to cache it by).
    #[getter]
    fn table_key(&self) -> Option<String> {
        self.table_of().map(Table::key)
    }

    /// `rows`: the table's rows and their width.
    #[getter]
    fn table_shape(&self) -> Option<(usize, usize)> {
        self.table_of().map(|t| (t.rows(), t.width()))
    }

    /// `rows`: the table's elements, 0 or 1, row-major.
    fn table<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.table_of().map(|t| PyBytes::new(py, &t.elements()))
    }

    /// `rows`: the range stored integers are clamped to first (-1 then picks the last row).
    #[getter]
    fn clamp(&self) -> Option<(i64, i64)> {
        match self.recipe {
            compact::Recipe::Rows { clamp, .. } => clamp,
            _ => None,
        }
    }

    /// `rows` and `entries`: the dense block's elements.
    #[getter]
    fn numel(&self) -> Option<usize> {
        match self.recipe {
            compact::Recipe::Rows { numel, .. } | compact::Recipe::Entries { numel, .. } => {
                Some(numel)
            }
            _ => None,
        }
    }

    /// `rows`: the shape the picked rows are viewed as (the dense shape, `axis` last).
    #[getter]
    fn rows_shape(&self) -> Option<Vec<usize>> {
        match &self.recipe {
            compact::Recipe::Rows { rows_shape, .. } => Some(rows_shape.clone()),
            _ => None,
        }
    }

    /// `rows` and `scatter`: the dense axis the rows (the classes) lie along.
    #[getter]
    fn axis(&self) -> Option<usize> {
        match self.recipe {
            compact::Recipe::Rows { axis, .. } | compact::Recipe::Scatter { axis, .. } => {
                Some(axis)
            }
            _ => None,
        }
    }

    /// `scatter`: the class count.
    #[getter]
    fn classes(&self) -> Option<usize> {
        match self.recipe {
            compact::Recipe::Scatter { classes, .. } => Some(classes),
            _ => None,
        }
    }

    /// `entries`: bytes of one stored row, and where its element's bits start.
    #[getter]
    fn entry_row(&self) -> Option<(usize, usize)> {
        match self.recipe {
            compact::Recipe::Entries {
                row_bytes,
                value_at,
                ..
            } => Some((row_bytes, value_at)),
            _ => None,
        }
    }

    fn __repr__(&self) -> String {
        format!("Recipe({:?})", self.recipe)
    }
}
