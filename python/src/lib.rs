//! `featshard._native`: the featshard command line run in process (so `pip install
//! featshard` gives the `featshard` command with no Rust toolchain), and the spec crate's
//! plans and geometry (padded lengths, owner-block positions, shapes, block windows,
//! rank coordinates, collate's joins), computed by the same functions the Rust executors
//! call, for the typed Python package around it. One abi3 module serves every CPython
//! >= 3.10; it links no libtorch.

#![deny(unsafe_code)]

mod agree;
mod buffer;
mod collate;
mod dlpack;
mod expand;
mod placement;
mod pool;
mod shard_folder;
mod tables;
mod window_reader;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use featshard_spec::ir::DType;
use featshard_spec::plan::Ownership;
use featshard_spec::replicas::Order;
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pythonize::pythonize;

fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// Runs the featshard command line `argv` (the program name first) and returns its exit
/// status, the interpreter's lock released meanwhile.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| featshard::cli::run(argv))
}

/// What `Plan.collate_join` returns: target, pad, repad and spreads.
type CollateJoin = (
    Vec<usize>,
    tables::Pad,
    Option<(usize, usize)>,
    Vec<(usize, usize, usize)>,
);

/// A compiled spec: its Plan IR and the geometry of any sample on any mesh.
#[pyclass(frozen, module = "featshard._native")]
struct Plan {
    plan: Arc<featshard_spec::Plan>,
}

#[pymethods]
impl Plan {
    /// Compiles the spec file at `path`; a spec error is a `ValueError` with the rendered
    /// diagnostic (file, line and column).
    #[staticmethod]
    fn from_file(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Plan> {
        py.detach(|| featshard_spec::compile_file(&path))
            .map(|(_, plan)| Plan {
                plan: Arc::new(plan),
            })
            .map_err(|d| value_error(format!("{:?}", miette::Report::new(d))))
    }

    /// Reads a plan from the JSON `featshard generate` writes to `<module>.plan.json`
    /// (its `$comment` header ignored); a `ValueError` names what does not fit.
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Plan> {
        let plan = featshard_spec::plan::integrity::from_json(text).map_err(value_error)?;
        Ok(Plan {
            plan: Arc::new(plan),
        })
    }

    /// The dense blocks of a rank's compact blocks `blocks` (feature name, its dense
    /// block's shape, DLPack capsule of the compact block as the source sent it),
    /// checked and expanded by the executor into one new buffer (huge pages advised):
    /// the buffer as a uint8 capsule, and each block's byte offset in it, in the order
    /// given. A block that is not its feature's compact form is a `ValueError` naming
    /// the feature.
    fn expand_blocks<'py>(
        &self,
        py: Python<'py>,
        blocks: Vec<(String, Vec<usize>, Bound<'py, pyo3::types::PyCapsule>)>,
    ) -> PyResult<(Bound<'py, PyAny>, Vec<usize>)> {
        let mut compact = Vec::with_capacity(blocks.len());
        for (name, dense, stored) in blocks {
            let plan = tensor(&self.plan, &name, dense.len())?;
            compact.push(expand::Compact {
                name,
                plan,
                dense,
                stored,
            });
        }
        expand::expand_blocks(py, &compact).map_err(value_error)
    }

    /// The pre-sharded sample folder `dir`: its manifest read (bounded) and checked
    /// against this plan and, with `mesh`, that CP mesh (see `ShardFolder`);
    /// `ValueError` naming the file otherwise.
    #[pyo3(signature = (dir, mesh = None))]
    fn shard_folder(
        &self,
        py: Python<'_>,
        dir: std::path::PathBuf,
        mesh: Option<Vec<usize>>,
    ) -> PyResult<shard_folder::PyShardFolder> {
        let mesh = mesh.map(|m| self.mesh(&m)).transpose()?;
        shard_folder::read(py, &self.plan, dir, mesh)
    }

    /// The spec's sha256, as the generated modules record it.
    #[getter]
    fn sha256(&self) -> String {
        self.plan.source.sha256.clone()
    }

    /// How feature `name`'s block in a sample (its blocks' local shapes `local`) joins
    /// a collated batch (the agreed local shapes `targets`): `(target, pad, repad,
    /// spread)`, `repad` the `(old, new)` block length of the semantic an index points
    /// into, `spread` the `(axis, old, new)` of each whole axis re-laid out block by
    /// block (see `featshard_exec::collate::Join`).
    fn collate_join(
        &self,
        name: &str,
        local: BTreeMap<String, Vec<usize>>,
        targets: BTreeMap<String, Vec<usize>>,
    ) -> PyResult<CollateJoin> {
        let join = featshard_exec::collate::join(&self.plan, name, &local, &targets)
            .map_err(|e| value_error(e.to_string()))?;
        let spread = join.spread.iter().map(|s| (s.axis, s.old, s.new));
        Ok((
            join.target,
            tables::Pad::from(join.pad),
            join.repad,
            spread.collect(),
        ))
    }

    /// The DTensor global shape of feature `name` collated from `batch` samples per
    /// replica on `dp` replicas of CP mesh `cp`, its local blocks padded to `local`.
    fn collated_shape(
        &self,
        name: &str,
        local: Vec<usize>,
        batch: usize,
        dp: usize,
        cp: Vec<usize>,
    ) -> PyResult<Vec<usize>> {
        let t = tensor(&self.plan, name, local.len())?;
        let cp = self.mesh(&cp)?;
        Ok(t.collated_global_shape(&local, batch, dp, cp))
    }

    /// The multiple `semantic`'s axes pad to on `mesh` (1 when never padded).
    fn pad_multiple(&self, semantic: &str, mesh: Vec<usize>) -> PyResult<usize> {
        let mesh = self.mesh(&mesh)?;
        self.semantic(semantic)?;
        Ok(self.plan.pad_multiple(semantic, mesh))
    }

    /// The length `semantic`'s axes pad to for `len` items on `mesh` (a CP mesh, or a
    /// domain mesh of one or two axes): a multiple of `pad_multiple`, long enough that
    /// every shard holds its halo; `len` itself where the semantic is never padded.
    fn padded_length(&self, semantic: &str, len: usize, mesh: Vec<usize>) -> PyResult<usize> {
        let mesh = self.mesh(&mesh)?;
        self.semantic(semantic)?;
        Ok(self.plan.padded_length(semantic, len, mesh))
    }

    /// The `(start, len)` per axis of `feature`'s global shape `global` that the rank at
    /// coordinate `coord` of domain mesh `mesh` holds: its `torch.chunk` piece on an
    /// uneven axis, its equal block on an even one.
    fn domain_window(
        &self,
        feature: &str,
        global: Vec<usize>,
        mesh: Vec<usize>,
        coord: Vec<usize>,
    ) -> PyResult<Vec<(usize, usize)>> {
        let t = tensor(&self.plan, feature, global.len())?;
        let sizes = self.mesh(&mesh)?;
        let at = sizes.coord_at(&coord).ok();
        at.and_then(|at| self.plan.domain_window(t, &global, sizes, at))
            .ok_or_else(|| {
                value_error(format!(
                    "feature `{feature}`: global shape {global:?} has no window at coordinate \
                 {coord:?} of mesh {mesh:?} (off the mesh, or an empty uneven shard)"
                ))
            })
    }

    /// ShardTensor's `sharding_shapes` of `feature` (global shape `global`) as the rank
    /// at `coord` of domain mesh `mesh` sees it: per mesh axis that splits it, the local
    /// shapes of the ranks along that axis, in order.
    fn sharding_shapes(
        &self,
        feature: &str,
        global: Vec<usize>,
        mesh: Vec<usize>,
        coord: Vec<usize>,
    ) -> PyResult<BTreeMap<usize, Vec<Vec<usize>>>> {
        let t = tensor(&self.plan, feature, global.len())?;
        let sizes = self.mesh(&mesh)?;
        let at = sizes.coord_at(&coord).ok();
        at.and_then(|at| self.plan.sharding_shapes(t, &global, sizes, at))
            .ok_or_else(|| {
                value_error(format!(
                    "feature `{feature}`: global shape {global:?} has no windows along the axes \
                 of coordinate {coord:?} of mesh {mesh:?} (off the mesh, or an empty uneven shard)"
                ))
            })
    }

    /// The real shape of output (or feature) `name` given padded as `shape`: its axes of
    /// a semantic `lengths` gives cut back to that length. The axes' semantics are
    /// `semantics` (one per axis, `None` for a channel axis) or the spec's declaration;
    /// `None` for a value the spec does not declare and no semantics are given for.
    #[pyo3(signature = (name, shape, lengths, semantics = None))]
    fn real_shape(
        &self,
        name: &str,
        shape: Vec<usize>,
        lengths: BTreeMap<String, usize>,
        semantics: Option<Vec<Option<String>>>,
    ) -> PyResult<Option<Vec<usize>>> {
        let axes = semantics.or_else(|| {
            let t = self.plan.tensor(name)?;
            Some(t.axes.iter().map(|a| a.semantic.clone()).collect())
        });
        let Some(axes) = axes else {
            return Ok(None);
        };
        self.plan
            .real_shape(&axes, &shape, &lengths)
            .map(Some)
            .map_err(|e| value_error(format!("output `{name}`: {e}")))
    }

    /// Every sample input's dtype name and shape for a sample known by its semantics'
    /// lengths alone (see `featshard_exec::validate::shapes_of_lengths`), as
    /// `check_shapes` takes them.
    fn input_shapes(
        &self,
        lengths: BTreeMap<String, usize>,
    ) -> PyResult<BTreeMap<String, (&'static str, Vec<usize>)>> {
        let shapes = featshard_exec::validate::shapes_of_lengths(&self.plan, &lengths)
            .map_err(value_error)?;
        Ok(shapes
            .into_iter()
            .map(|(n, (d, shape))| (n, (d.name(), shape)))
            .collect())
    }

    /// Validates `features` (name -> a tensor's DLPack capsule, or the description of
    /// a value that is not a readable tensor) and places them on `mesh`; `objects`
    /// holds each such value pickled (or why it does not pickle), which it rides in
    /// when it is passed through; see `_native.pyi`.
    #[pyo3(signature = (features, mesh, workflow = None, passthrough = BTreeSet::new(), threads = 1, objects = BTreeMap::new()))]
    #[allow(clippy::too_many_arguments)]
    fn place(
        &self,
        py: Python<'_>,
        features: BTreeMap<String, placement::Value<'_>>,
        mesh: Vec<usize>,
        workflow: Option<String>,
        passthrough: BTreeSet<String>,
        threads: usize,
        objects: BTreeMap<String, placement::Object>,
    ) -> PyResult<placement::Placement> {
        let opts = featshard_exec::Options {
            workflow,
            passthrough,
            threads,
        };
        let mesh = self.mesh(&mesh)?;
        placement::place(py, &self.plan, features, mesh, opts, objects)
    }

    /// The generated module's name.
    #[getter]
    fn module(&self) -> String {
        self.plan.module.clone()
    }

    /// The Plan IR as the JSON `featshard generate` writes to `<module>.plan.json`.
    fn json(&self) -> PyResult<String> {
        featshard_codegen::plan_json(&self.plan).map_err(value_error)
    }

    /// The Plan IR as Python dicts and lists (what `<module>.plan.json` holds).
    fn ir<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pythonize(py, &*self.plan).map_err(value_error)
    }

    /// The checks of `place` that need no values, on `shapes` (every tensor input's
    /// dtype name and shape, from a file's header, say): the semantics' lengths, or a
    /// `ValueError` with the executor's message.
    fn check_shapes(
        &self,
        shapes: BTreeMap<String, (String, Vec<usize>)>,
    ) -> PyResult<BTreeMap<String, usize>> {
        let typed = shapes
            .into_iter()
            .map(|(name, (dtype, shape))| Ok((name.clone(), (dtype_named(&name, &dtype)?, shape))))
            .collect::<PyResult<_>>()?;
        featshard_exec::validate::check_shapes(&self.plan, &typed).map_err(value_error)
    }

    /// The checks of domain model parameter `name` given as `dtype` (a spec dtype name)
    /// and `shape`, before it is sharded over the domain mesh `mesh`: rank, dtype,
    /// channel sizes, each split axis at least as long as its ranks; a `ValueError` with
    /// the executor's message.
    fn check_parameter(
        &self,
        name: &str,
        dtype: &str,
        shape: Vec<usize>,
        mesh: Vec<usize>,
    ) -> PyResult<()> {
        let dtype = dtype_named(name, dtype)?;
        let mesh = self.mesh(&mesh)?;
        featshard_exec::validate::check_parameter(&self.plan, name, dtype, &shape, mesh)
            .map_err(value_error)
    }

    /// The frame of this replica's batch: each sample's blocks' local shapes by name,
    /// and its other values (a tensor's dtype and shape, or `None`); `ValueError`
    /// naming what the batch holds that collate refuses. With `samples` None, the frame
    /// of a replica that failed (it takes part in the reduction all the same).
    #[pyo3(signature = (samples, others = None))]
    fn collate_frame(
        &self,
        samples: Option<Vec<BTreeMap<String, Vec<usize>>>>,
        others: Option<Vec<featshard_exec::collate::Others>>,
    ) -> PyResult<collate::CollateFrame> {
        let Some(samples) = samples else {
            return Ok(collate::CollateFrame {
                frame: featshard_exec::collate::failed_frame(&self.plan),
            });
        };
        let others = others.unwrap_or_else(|| vec![Default::default(); samples.len()]);
        collate::frame(&self.plan, &samples, &others).map_err(value_error)
    }

    /// Every held feature's target local shape from `frame` reduced by max over the DP
    /// group; `None` when a replica failed (the ranks then exchange status frames);
    /// `ValueError` (every rank's same message) where the replicas' batches differ in
    /// size or features.
    fn collate_targets(
        &self,
        frame: &collate::CollateFrame,
        reduced: Vec<i64>,
    ) -> PyResult<Option<BTreeMap<String, Vec<usize>>>> {
        featshard_exec::collate::collate_targets(&self.plan, &frame.frame, &reduced)
            .map_err(value_error)
    }

    /// The part of `window` (`(start, len)` per axis of feature `name`'s padded layout)
    /// that holds real items given every semantic's real length: `(start, stop)` per axis.
    fn real_window(
        &self,
        name: &str,
        window: Vec<(usize, usize)>,
        lengths: BTreeMap<String, usize>,
    ) -> PyResult<Vec<(usize, usize)>> {
        let t = tensor(&self.plan, name, window.len())?;
        Ok(t.real_window(&window, &lengths))
    }

    /// The samples of a pre-sharded dataset folder `root` that did not fail, from its
    /// `dataset.json` (read bounded, checked against this plan and the CP mesh `mesh`).
    fn read_dataset(
        &self,
        py: Python<'_>,
        root: std::path::PathBuf,
        mesh: Vec<usize>,
    ) -> PyResult<Vec<String>> {
        let mesh = self.mesh(&mesh)?;
        let d = py
            .detach(|| featshard_exec::shard_folder::read_dataset(&self.plan, &root, mesh))
            .map_err(value_error)?;
        Ok(d.samples
            .into_iter()
            .filter(|s| s.status != featshard_spec::shards::Status::Failed)
            .map(|s| s.name)
            .collect())
    }

    /// One sample's layout on `mesh` (a CP mesh, or a domain mesh of one or two axes)
    /// (`SampleLayout`: padded lengths, owner-block positions and blocks), from the
    /// length of every semantic present and, for each owner-partitioned one, its items
    /// per direct owner (`counts`) or the direct owner of every item (`owners`).
    #[pyo3(signature = (mesh, sizes, counts = BTreeMap::new(), owners = BTreeMap::new()))]
    fn layout(
        &self,
        mesh: Vec<usize>,
        sizes: BTreeMap<String, usize>,
        counts: BTreeMap<String, Vec<usize>>,
        owners: BTreeMap<String, Vec<usize>>,
    ) -> PyResult<tables::Layout> {
        let mut ownership: BTreeMap<String, Ownership> = counts
            .into_iter()
            .map(|(s, c)| (s, Ownership::Counts(c)))
            .collect();
        ownership.extend(owners.into_iter().map(|(s, o)| (s, Ownership::Owners(o))));
        let layout = self.plan.checked_layout(&mesh, &sizes, &ownership);
        Ok(tables::Layout {
            layout: layout.map_err(value_error)?,
        })
    }

    /// Every named feature's shapes under `layout`.
    fn shapes(
        &self,
        layout: &tables::Layout,
        names: Vec<String>,
    ) -> PyResult<BTreeMap<String, tables::Shapes>> {
        let shapes = self
            .plan
            .shapes_of(&layout.layout, names.iter().map(String::as_str))
            .map_err(value_error)?;
        Ok(shapes
            .into_iter()
            .map(|(n, s)| (n, tables::Shapes::of(s)))
            .collect())
    }

    /// Every tensor feature, by name.
    #[getter]
    fn features(&self) -> BTreeMap<String, tables::Feature> {
        let t = self.plan.tensors();
        t.map(|(n, t)| (n.to_owned(), tables::Feature::of(n, t)))
            .collect()
    }

    /// Every feature passed through untouched (metadata), sorted.
    #[getter]
    fn metadata(&self) -> Vec<String> {
        let f = &self.plan.features;
        f.iter()
            .filter(|(_, f)| matches!(f, featshard_spec::plan::FeaturePlan::Metadata { .. }))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Every axis semantic, by name.
    #[getter]
    fn semantics(&self) -> BTreeMap<String, tables::Semantic> {
        let s = &self.plan.semantics;
        s.iter()
            .map(|(n, s)| (n.clone(), tables::Semantic::of(s)))
            .collect()
    }

    /// The names of the mesh axes that split a sample (`(cp0, cp1)`, or the domain
    /// mesh's one or two axes).
    #[getter]
    fn mesh_axes(&self) -> Vec<String> {
        self.plan.mesh.axes().to_vec()
    }

    /// The DP dimension (if any) and the sample dimensions of a device mesh of `ndim`
    /// dimensions named `names`, found by the spec's names (`MeshPlan::dims`).
    #[pyo3(signature = (names, ndim))]
    fn mesh_dims(
        &self,
        names: Option<Vec<String>>,
        ndim: usize,
    ) -> PyResult<(Option<usize>, Vec<usize>)> {
        let d = self
            .plan
            .mesh
            .dims(names.as_deref(), ndim)
            .map_err(value_error)?;
        Ok((d.dp, d.sample))
    }

    /// The device mesh of `dp` replicas of a mesh of `sizes` for this plan: its
    /// dimension names (the DP axis first where the spec names one), their sizes, and
    /// the world it takes; `ValueError` naming what does not fit the spec.
    fn device_mesh(
        &self,
        sizes: Vec<usize>,
        dp: usize,
    ) -> PyResult<(Vec<String>, Vec<usize>, usize)> {
        let m = self
            .plan
            .mesh
            .replicated(dp, &sizes)
            .map_err(|e| value_error(format!("mesh: {e}")))?;
        let mut shape: Vec<usize> = self.plan.mesh.dp.iter().map(|_| m.dp).collect();
        shape.extend(m.cp.sizes());
        Ok((self.plan.mesh.dim_names(), shape, m.world()))
    }

    /// The data-parallel axis's name, if the spec names one.
    #[getter]
    fn dp_axis(&self) -> Option<String> {
        self.plan.mesh.dp.clone()
    }

    /// A domain plan's per-axis flags (shards may be uneven); `None` for a CP plan.
    #[getter]
    fn uneven(&self) -> Option<Vec<bool>> {
        let m = &self.plan.mesh;
        m.is_domain()
            .then(|| (0..m.axes().len()).map(|a| m.uneven(a)).collect())
    }

    /// The `(start, len)` per axis of `feature`'s padded layout that the rank at CP
    /// coordinate `coord` of `mesh` holds, for local block shape `local`.
    fn block_window(
        &self,
        feature: &str,
        local: Vec<usize>,
        coord: Vec<usize>,
        mesh: Vec<usize>,
    ) -> PyResult<Vec<(usize, usize)>> {
        let t = tensor(&self.plan, feature, local.len())?;
        let sizes = self.mesh(&mesh)?;
        let at = coord_on(&coord, sizes, &self.plan.mesh)?;
        t.checked_block_window(&local, at).ok_or_else(|| {
            value_error(format!(
                "coord: {coord:?} puts a block of {local:?} past the largest layout"
            ))
        })
    }
}

impl Plan {
    /// A mesh from Python: one size per axis of the spec's mesh.
    fn mesh(&self, sizes: &[usize]) -> PyResult<featshard_spec::Mesh> {
        self.plan
            .mesh
            .matched(sizes)
            .map_err(|e| value_error(format!("mesh: {e}")))
    }

    fn semantic(&self, name: &str) -> PyResult<()> {
        if self.plan.semantics.contains_key(name) {
            return Ok(());
        }
        Err(PyKeyError::new_err(format!(
            "semantic `{name}`: not a semantic of the spec"
        )))
    }
}

/// The dtype the spec and the executor call `name` (for feature `feature`).
fn dtype_named(feature: &str, name: &str) -> PyResult<DType> {
    DType::ALL
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| {
            value_error(format!(
                "feature `{feature}`: dtype `{name}` is not a spec dtype"
            ))
        })
}

/// `coord` (one index per axis) checked to lie on `mesh`, whose axes `axes` names.
pub(crate) fn coord_on(
    coord: &[usize],
    mesh: featshard_spec::Mesh,
    axes: &featshard_spec::plan::MeshPlan,
) -> PyResult<featshard_spec::Coord> {
    mesh.coord_at(coord).map_err(|_| {
        // Written as Python writes the tuple it was given.
        let parts: Vec<String> = coord.iter().map(ToString::to_string).collect();
        let tuple = match parts.len() {
            1 => format!("({},)", parts[0]),
            _ => format!("({})", parts.join(", ")),
        };
        value_error(format!(
            "coord: {tuple} is not on mesh {}",
            axes.named(mesh)
        ))
    })
}

/// Tensor feature `name` of the plan, whose blocks have `rank` axes.
fn tensor<'p>(
    plan: &'p featshard_spec::Plan,
    name: &str,
    rank: usize,
) -> PyResult<&'p featshard_spec::plan::TensorPlan> {
    match plan.tensor(name) {
        Some(t) if t.axes.len() == rank => Ok(t),
        Some(t) => Err(value_error(format!(
            "feature `{name}`: {} axes, but a local shape of {rank} was given",
            t.axes.len()
        ))),
        None => Err(PyKeyError::new_err(format!(
            "feature `{name}`: not a tensor feature of the spec"
        ))),
    }
}

/// A uint8 buffer of `len` bytes to receive a rank's blocks into, as a DLPack capsule:
/// recycled block memory where some is free (its old bytes kept: the receive writes
/// every one), else new memory with huge pages advised.
#[pyfunction]
fn receive_buffer(py: Python<'_>, len: usize) -> PyResult<Bound<'_, PyAny>> {
    let buffer = dlpack::Buffer::new(len).map_err(value_error)?;
    buffer.into_capsule(py)
}

/// Gives the block memory kept for reuse back to the system; returns how many buffers
/// were kept.
#[pyfunction]
fn release_buffers() -> usize {
    pool::release()
}

/// The mesh coordinate of rank `rank`: `(i, j)` of rank `i * cp1 + j` on a two-axis
/// mesh, `(rank,)` on a one-axis mesh.
#[pyfunction]
fn coords(py: Python<'_>, mesh: Vec<usize>, rank: usize) -> PyResult<Bound<'_, PyTuple>> {
    let mesh = featshard_spec::Mesh::new(&mesh).map_err(|e| value_error(format!("mesh: {e}")))?;
    let at = mesh
        .checked_coord(rank)
        .map_err(|e| value_error(format!("rank: {e}")))?;
    PyTuple::new(py, at.as_slice())
}

/// The `torch.chunk` pieces of `len` items over `ranks` (how ShardTensor splits an
/// uneven axis); `ValueError` when a shard would be empty.
#[pyfunction]
fn chunk_sizes(len: usize, ranks: usize) -> PyResult<Vec<usize>> {
    featshard_spec::plan::chunk_sizes(len, ranks).ok_or_else(|| {
        value_error(format!(
            "{len} items over {ranks} ranks would leave a shard empty"
        ))
    })
}

/// The samples DP replica `replica` of `dp` reads in `epoch`, in order: dataset order,
/// or shuffled by `seed` and the epoch; the tail wraps around (or is dropped with
/// `drop_last`) so that every replica reads as many.
#[pyfunction]
#[pyo3(signature = (n, dp, replica, *, epoch = 0, seed = None, drop_last = false))]
fn replica_indices(
    n: usize,
    dp: usize,
    replica: usize,
    epoch: u64,
    seed: Option<u64>,
    drop_last: bool,
) -> PyResult<Vec<usize>> {
    if dp == 0 {
        return Err(value_error("dp: a DP size is at least 1, given 0"));
    }
    let order = seed.map_or(Order::Sequential, |seed| Order::Shuffled { seed });
    featshard_spec::replicas::checked_replica_indices(n, order, epoch, dp, replica, drop_last)
        .map_err(value_error)
}

/// The executor's expansion vectors, which every executor of compact blocks is held
/// to: each stored block's slot (its form, dense dtype and shape), its bytes, and the
/// dense bytes the executor makes of it (`featshard_exec::vectors`).
#[pyfunction]
fn expansion_vectors(
    py: Python<'_>,
) -> Vec<(
    buffer::Slot,
    Bound<'_, pyo3::types::PyBytes>,
    Bound<'_, pyo3::types::PyBytes>,
)> {
    featshard_exec::vectors::expansion_vectors()
        .into_iter()
        .map(|v| {
            let packed = pyo3::types::PyBytes::new(py, &v.packed);
            let dense = pyo3::types::PyBytes::new(py, &v.dense);
            (buffer::Slot { slot: v.slot }, packed, dense)
        })
        .collect()
}

/// Runs of `sizes` bytes laid back to back as a rank buffer lays out its blocks: their
/// byte offsets, and the bytes they span (`featshard_exec::buffer::packed`).
#[pyfunction]
fn packed_offsets(sizes: Vec<usize>) -> (Vec<usize>, usize) {
    featshard_exec::buffer::packed(&sizes)
}

/// Row-major strides (in elements) of a tensor of `shape`.
#[pyfunction]
fn contiguous_stride(shape: Vec<usize>) -> Vec<usize> {
    featshard_spec::layout::contiguous_stride(&shape)
}

/// One safetensors file's header, read alone and checked (the executor's reader): every
/// tensor's `(name, dtype, shape, byte offset in the file)`, sorted by name, and the
/// `__metadata__`.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn read_header(
    py: Python<'_>,
    path: std::path::PathBuf,
) -> PyResult<(
    Vec<(String, &'static str, Vec<usize>, u64)>,
    BTreeMap<String, String>,
)> {
    let h = py
        .detach(|| featshard_exec::files::read_header(&path))
        .map_err(value_error)?;
    let entries = h
        .entries
        .into_iter()
        .map(|e| (e.name, e.dtype.name(), e.shape, h.data_start + e.offsets.0))
        .collect();
    Ok((entries, h.metadata.into_iter().collect()))
}

/// The Plan IR of the spec file at `path`, as Python dicts and lists (see `Plan.ir`).
#[pyfunction]
fn plan_ir(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Bound<'_, PyAny>> {
    Plan::from_file(py, path)?.ir(py)
}

/// The Plan IR of the spec file at `path`, as JSON (see `Plan.json`).
#[pyfunction]
fn plan_json(py: Python<'_>, path: std::path::PathBuf) -> PyResult<String> {
    Plan::from_file(py, path)?.json()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Plan>()?;
    m.add_class::<placement::Placement>()?;
    m.add_class::<buffer::BufferLayout>()?;
    m.add_class::<buffer::Header>()?;
    m.add_class::<buffer::Slot>()?;
    m.add_class::<buffer::Recipe>()?;
    m.add_class::<collate::CollateFrame>()?;
    m.add_class::<window_reader::WindowReader>()?;
    m.add_class::<shard_folder::PyShardFolder>()?;
    m.add_class::<tables::Feature>()?;
    m.add_class::<tables::Semantic>()?;
    m.add_class::<tables::Layout>()?;
    m.add_class::<tables::Shapes>()?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_class::<agree::PyTerms>()?;
    m.add("STATUS_BYTES", featshard_exec::agree::STATUS_BYTES)?;
    // The executor's constants, for the adapters that lay out its bytes and keys.
    m.add("ALIGN", featshard_exec::buffer::ALIGN)?;
    m.add("PATH", featshard_spec::names::PATH)?;
    m.add_function(wrap_pyfunction!(agree::status_frame, m)?)?;
    m.add_function(wrap_pyfunction!(agree::read_status, m)?)?;
    m.add_function(wrap_pyfunction!(agree::vote, m)?)?;
    m.add_function(wrap_pyfunction!(agree::unanimous, m)?)?;
    m.add_function(wrap_pyfunction!(agree::verdict, m)?)?;
    m.add_function(wrap_pyfunction!(plan_json, m)?)?;
    m.add_function(wrap_pyfunction!(plan_ir, m)?)?;
    m.add_function(wrap_pyfunction!(read_header, m)?)?;
    m.add_function(wrap_pyfunction!(coords, m)?)?;
    m.add_function(wrap_pyfunction!(receive_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(release_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(chunk_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(contiguous_stride, m)?)?;
    m.add_function(wrap_pyfunction!(packed_offsets, m)?)?;
    m.add_function(wrap_pyfunction!(expansion_vectors, m)?)?;
    m.add_function(wrap_pyfunction!(replica_indices, m)?)?;
    Ok(())
}
