//! The plan's tables and a sample's layout as typed Python objects: what the package
//! reads of the Plan IR (placements, axes, pad values, roles, semantics, the mesh) and
//! of a layout, with no dict decoding on the Python side.

use std::collections::BTreeMap;

use featshard_spec::ir::{PadValue, Placement, Role};
use featshard_spec::plan::{Padding, SampleLayout, SemanticPlan, Split, TensorPlan};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// A DTensor placement per mesh axis: the tensor dimension it shards, or `None` for
/// `Replicate()`.
fn shard_dims(p: &[Placement]) -> Vec<Option<usize>> {
    p.iter()
        .map(|p| match p {
            Placement::Shard(d) => Some(*d),
            Placement::Replicate => None,
        })
        .collect()
}

/// One tensor feature of the plan.
#[pyclass(frozen, get_all, module = "featshard._native")]
pub struct Feature {
    /// The feature's name.
    name: String,
    /// Its dtype, as torch names it.
    dtype: String,
    /// Per axis: the semantic it counts, or `None` for a channel axis.
    semantics: Vec<Option<String>>,
    /// Per axis: a channel axis's fixed size, or `None`.
    sizes: Vec<Option<u64>>,
    /// Per axis: the mesh axis (index) that splits it, or `None` for a whole axis.
    splits: Vec<Option<usize>>,
    /// Per mesh axis: the tensor dimension sharded over it, or `None` (replicated).
    placements: Vec<Option<usize>>,
    /// The same on `(dp, cp0, cp1)` after collate.
    placements_dp: Vec<Option<usize>>,
    /// `"data"`, `"mask"` or `"index"`.
    role: &'static str,
    /// The one-hot axis, where the feature declares one.
    one_hot: Option<usize>,
    /// Mostly zero: it travels as its nonzero elements, and may be given as them.
    sparse: bool,
    /// `(lo, hi)`: every value lies in it, and it travels narrowed.
    range: Option<(i64, i64)>,
    /// A sample may lack it.
    optional: bool,
    /// A model parameter of a domain plan (not a sample input).
    parameter: bool,
    /// A model output of a domain plan (not a sample input).
    output: bool,
    /// The value at pad positions.
    pad_value: Pad,
}

/// A pad value as Python holds it: `bool`, `int` or `float`, as the dtype does.
#[derive(Clone, IntoPyObject)]
pub enum Pad {
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl From<PadValue> for Pad {
    fn from(p: PadValue) -> Pad {
        match p {
            PadValue::Bool(b) => Pad::Bool(b),
            PadValue::Int(i) => Pad::Int(i),
            PadValue::Float(x) => Pad::Float(x),
        }
    }
}

#[pymethods]
impl Feature {
    fn __repr__(&self) -> String {
        format!(
            "Feature({:?}, {}, {:?})",
            self.name, self.dtype, self.semantics
        )
    }
}

impl Feature {
    pub fn of(name: &str, t: &TensorPlan) -> Feature {
        Feature {
            name: name.to_owned(),
            dtype: t.dtype.name().to_owned(),
            semantics: t.axes.iter().map(|a| a.semantic.clone()).collect(),
            sizes: t.axes.iter().map(|a| a.size).collect(),
            splits: t.axes.iter().map(|a| split_axis(&a.split)).collect(),
            placements: shard_dims(&t.placements),
            placements_dp: shard_dims(&t.placements_dp),
            role: match t.role {
                Role::Data => "data",
                Role::Mask { .. } => "mask",
                Role::Index(_) => "index",
            },
            one_hot: t.one_hot,
            sparse: t.sparse,
            range: t.range.map(|[lo, hi]| (lo, hi)),
            optional: t.optional,
            parameter: t.parameter,
            output: t.output,
            pad_value: Pad::from(t.pad_value),
        }
    }
}

fn split_axis(s: &Split) -> Option<usize> {
    match *s {
        Split::Whole => None,
        Split::Mesh { mesh_axis } | Split::Follows { mesh_axis, .. } => Some(mesh_axis),
    }
}

/// One axis semantic of the plan.
#[pyclass(frozen, get_all, module = "featshard._native")]
pub struct Semantic {
    /// Split over the mesh.
    sharded: bool,
    /// The batch axis (a domain plan's, always 1).
    batch: bool,
    /// Mesh axes whose sizes its length pads to a multiple of (empty: never padded
    /// that way).
    pad_mesh_axes: Vec<usize>,
    /// Every shard is a multiple of `stride` long.
    stride: u32,
    /// Every shard is at least `halo` long.
    halo: u32,
}

impl Semantic {
    pub fn of(s: &SemanticPlan) -> Semantic {
        Semantic {
            sharded: s.sharded,
            batch: s.batch,
            pad_mesh_axes: match &s.padding {
                Padding::Multiple { mesh_axes, .. } => mesh_axes.clone(),
                _ => Vec::new(),
            },
            stride: s.stride.max(1),
            halo: s.halo,
        }
    }
}

/// One sample laid out on one mesh: serial and padded lengths, and the owner blocks of
/// every owner-partitioned semantic.
#[pyclass(frozen, module = "featshard._native")]
pub struct Layout {
    pub layout: SampleLayout,
}

#[pymethods]
impl Layout {
    /// Mesh sizes, one per axis of the spec's mesh: `(cp0, cp1)` or `(cp,)`.
    #[getter]
    fn mesh<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.layout.mesh.sizes())
    }

    /// Serial length of every semantic present.
    #[getter]
    fn sizes(&self) -> BTreeMap<String, usize> {
        self.layout.sizes.clone()
    }

    /// Padded length of every semantic present.
    #[getter]
    fn padded(&self) -> BTreeMap<String, usize> {
        self.layout.padded.clone()
    }

    /// Owner-partitioned semantics: every item's padded position, in serial order.
    #[getter]
    fn positions(&self) -> BTreeMap<String, Vec<usize>> {
        self.layout.positions.clone()
    }

    /// Owner-partitioned semantics: padded items per owner block.
    #[getter]
    fn per_block(&self) -> BTreeMap<String, usize> {
        let b = &self.layout.blocks;
        b.iter().map(|(s, b)| (s.clone(), b.per_block)).collect()
    }

    /// Owner-partitioned semantics: real items in each owner block.
    #[getter]
    fn block_counts(&self) -> BTreeMap<String, Vec<usize>> {
        let b = &self.layout.blocks;
        b.iter()
            .map(|(s, b)| (s.clone(), b.block_counts.clone()))
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "Layout(mesh={:?}, padded={:?})",
            self.layout.mesh, self.layout.padded
        )
    }
}

/// One feature's shapes under a layout.
#[pyclass(frozen, get_all, module = "featshard._native")]
pub struct Shapes {
    /// The sample's shape.
    serial: Vec<usize>,
    /// The padded layout's.
    padded: Vec<usize>,
    /// The DTensor's global shape.
    global_: Vec<usize>,
    /// Every rank's local block.
    local: Vec<usize>,
}

impl Shapes {
    pub fn of(s: featshard_spec::plan::FeatureShapes) -> Shapes {
        Shapes {
            serial: s.serial_shape,
            padded: s.padded_shape,
            global_: s.global_shape,
            local: s.local_shape,
        }
    }
}
