//! One sample validated and placed on a CP mesh by the byte executor (`featshard-exec`),
//! on the torch tensors' own memory (DLPack), and any rank's blocks written straight
//! into tensors the caller allocated: no padded copy, features shared out over threads,
//! the interpreter's lock held while the sample's tensors are read (each checked to be
//! where it was placed). The executor `featshard shard` and the tch runtime
//! run on: one set of rules for every front end. With `dlpack`, the boundary where
//! tensor memory is viewed: the placed views are kept next to the memory they read.

use std::collections::BTreeMap;
use std::sync::Arc;

use featshard_exec::array::Array;
use featshard_exec::blocks::{feature_blocks, FeatureBlocks, Part};
use featshard_exec::files::Sample;
use featshard_exec::{ExecError, Options, Placed};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::buffer::BufferLayout;
use crate::dlpack::{Buffer, Memory};

fn runtime_error(e: ExecError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A sample placed on a mesh. The sample's tensors must not be written or resized
/// while it lives: its blocks are read from their memory when written.
#[pyclass(frozen, module = "featshard._native")]
pub(crate) struct Placement {
    // Declared first so it drops first: it views the memory of `inputs`.
    placed: Placed<'static>,
    plan: Arc<featshard_spec::Plan>,
    inputs: Vec<(String, Memory)>,
    /// Passed-through values that are not tensors: each rides its own slot as its
    /// pickle (`Ok`), or cannot ride at all (`Err`: why it does not pickle).
    objects: BTreeMap<String, Result<(), String>>,
}

/// A value that is not a readable tensor, as Python pickled it: its bytes, or why it
/// does not pickle.
#[derive(FromPyObject)]
pub(crate) enum Object {
    Pickled(Vec<u8>),
    Unpicklable(String),
}

/// A tensor's DLPack capsule with the tensor's storage.
type Capsule<'py> = (Bound<'py, PyCapsule>, Bound<'py, PyAny>);

/// What a feature value is: a tensor, a sparse COO tensor as its parts (coordinates
/// `[axes, n]` and values `[n]` as given, not coalesced, and its size), or the
/// description of a value the executor cannot read (its type or dtype).
#[derive(FromPyObject)]
pub(crate) enum Value<'py> {
    Tensor(Capsule<'py>),
    Sparse((Capsule<'py>, Capsule<'py>, Vec<usize>)),
    Other(String),
}

/// The keys a sparse tensor given as feature `name` becomes, as a sample file gives a
/// sparse feature's elements (see `featshard_exec::compact::INDICES`); a sample that
/// also gives one of them is refused.
fn sparse_keys(name: &str, features: &BTreeMap<String, Value<'_>>) -> PyResult<[String; 3]> {
    use featshard_exec::compact::{INDICES, SHAPE, VALUES};
    let keys = [INDICES, VALUES, SHAPE].map(|k| format!("{name}{k}"));
    if let Some(k) = keys.iter().find(|k| features.contains_key(*k)) {
        return Err(PyValueError::new_err(format!(
            "feature `{name}`: given both as a sparse tensor and as its elements (`{k}`); give one"
        )));
    }
    Ok(keys)
}

/// The sparse feature whose elements key `key` is (`NAME.indices`, `NAME.values` or
/// `NAME.shape`), if it is one.
fn sparse_feature_of<'p>(plan: &'p featshard_spec::Plan, key: &str) -> Option<&'p str> {
    use featshard_exec::compact::{INDICES, SHAPE, VALUES};
    let stem = [INDICES, VALUES, SHAPE]
        .iter()
        .find_map(|suffix| key.strip_suffix(suffix))?;
    plan.tensors()
        .find(|(n, t)| t.sparse && *n == stem)
        .map(|(n, _)| n)
}

/// The tensors a sample's values are (a sparse tensor's parts under their element
/// keys), the values the executor cannot read (with what they are), and the sparse
/// tensors' sizes under their `NAME.shape` keys.
type Gathered = (
    Vec<(String, Memory)>,
    Vec<(String, String)>,
    Vec<(String, Vec<usize>)>,
);

fn gathered(features: &BTreeMap<String, Value<'_>>) -> PyResult<Gathered> {
    let (mut inputs, mut opaque, mut shapes) = (Vec::new(), Vec::new(), Vec::new());
    let memory = |name: &str, (c, storage): &Capsule<'_>| {
        Memory::new(name, c)?.with_storage(name, storage.clone())
    };
    for (name, value) in features {
        match value {
            Value::Tensor(t) => inputs.push((name.clone(), memory(name, t)?)),
            Value::Sparse((indices, values, size)) => {
                let [ik, vk, sk] = sparse_keys(name, features)?;
                inputs.push((ik, memory(name, indices)?));
                inputs.push((vk, memory(name, values)?));
                shapes.push((sk, size.clone()));
            }
            Value::Other(what) => opaque.push((name.clone(), what.clone())),
        }
    }
    Ok((inputs, opaque, shapes))
}

/// The values the executor cannot read, each an empty placeholder (dropped or passed
/// through by name, never read); a `TypeError` naming the feature for one that is a
/// feature's tensor or a sparse feature's elements.
fn opaque_arrays(
    plan: &featshard_spec::Plan,
    opaque: Vec<(String, String)>,
    sample: &mut Sample<'_>,
) -> PyResult<()> {
    for (name, what) in opaque {
        if let Some(feature) = sparse_feature_of(plan, &name) {
            let message = format!(
                "feature `{feature}`: `{name}` (its elements) must be a tensor of a spec dtype, got {what}"
            );
            return Err(PyTypeError::new_err(message));
        }
        if let Some(t) = plan.tensor(&name) {
            let message = format!(
                "feature `{name}`: expected a {} tensor, got {what}",
                t.dtype.name()
            );
            return Err(PyTypeError::new_err(message));
        }
        sample.insert(
            name,
            Array::owned(featshard_spec::ir::DType::Uint8, vec![0], Vec::new()),
        );
    }
    Ok(())
}

/// Validates and places `features` (see `Plan.place` in `_native.pyi`).
pub(crate) fn place(
    py: Python<'_>,
    plan: &Arc<featshard_spec::Plan>,
    features: BTreeMap<String, Value<'_>>,
    mesh: featshard_spec::Mesh,
    opts: Options,
    objects: BTreeMap<String, Object>,
) -> PyResult<Placement> {
    let (inputs, opaque, shapes) = gathered(&features)?;
    let mut sample = Sample::new();
    for (key, size) in shapes {
        let bytes = size
            .iter()
            .flat_map(|&n| (n as i64).to_le_bytes())
            .collect();
        let shape = vec![size.len()];
        let array = Array::owned(featshard_spec::ir::DType::Int64, shape, bytes);
        sample.insert(key, array);
    }
    for (name, m) in &inputs {
        // SAFETY: the slice lives in `Placement::placed`, which drops before `inputs`
        // (or in `sample` below, dropped before this function returns `inputs`).
        #[allow(unsafe_code)]
        let bytes = unsafe { m.bytes_unbound() };
        sample.insert(
            name.clone(),
            Array::borrowed(m.dtype, m.shape.clone(), bytes, None),
        );
    }
    opaque_arrays(plan, opaque, &mut sample)?;
    // A domain plan's blocks differ per rank: written one rank at a time, never as
    // one buffer shape for all (`rank_buffer` refuses them).
    let place = if plan.mesh.is_domain() {
        featshard_exec::place_domain
    } else {
        featshard_exec::place
    };
    // The interpreter's lock stays held while the tensors are read: no Python thread
    // can resize or free one meanwhile (see `Memory::check_alive`).
    let _ = py;
    let mut placed = place(plan, mesh, &sample, &opts).map_err(runtime_error)?;
    let objects = carried_objects(&mut placed, objects);
    Ok(Placement {
        placed,
        plan: Arc::clone(plan),
        inputs,
        objects,
    })
}

/// The passed-through values that are not tensors put in their pickles' place (an
/// opaque value's placeholder holds no bytes): what rides each one's slot.
fn carried_objects(
    placed: &mut Placed<'static>,
    mut objects: BTreeMap<String, Object>,
) -> BTreeMap<String, Result<(), String>> {
    let mut out = BTreeMap::new();
    for (name, x) in placed.passthrough.iter_mut() {
        match objects.remove(name) {
            Some(Object::Pickled(bytes)) => {
                let shape = vec![bytes.len()];
                *x = Array::owned(featshard_spec::ir::DType::Uint8, shape, bytes);
                out.insert(name.clone(), Ok(()));
            }
            Some(Object::Unpicklable(why)) => {
                out.insert(name.clone(), Err(why));
            }
            None => {}
        }
    }
    out
}

#[pymethods]
impl Placement {
    /// The sample's layout.
    fn layout(&self) -> crate::tables::Layout {
        crate::tables::Layout {
            layout: self.placed.layout.clone(),
        }
    }

    /// Every placed feature: `(name, dtype, block shape, global shape)`, sorted by name.
    #[allow(clippy::type_complexity)]
    fn features(&self) -> Vec<(String, &'static str, Vec<usize>, Vec<usize>)> {
        self.placed
            .arrays
            .keys()
            .filter_map(|n| {
                let s = self.placed.shapes.get(n)?;
                Some((
                    n.clone(),
                    self.plan.tensor(n)?.dtype.name(),
                    s.local_shape.clone(),
                    s.global_shape.clone(),
                ))
            })
            .collect()
    }

    /// The layout of every rank's buffer (`rank_buffer`; with `compact`, blocks with a
    /// compact form held in it): the executor's contract, `featshard_exec::buffer`.
    #[pyo3(signature = (compact = false))]
    fn buffer_layout(&self, compact: bool) -> PyResult<BufferLayout> {
        Ok(BufferLayout::new(self.laid_out(compact)?))
    }

    /// The header a source sends for this sample (`featshard_exec::header`, the same
    /// bytes as the tch runtime's): the layout and every rank's buffer (see
    /// `buffer_layout`), the sample's index where the caller knows it.
    #[pyo3(signature = (compact = false, sample = None))]
    fn header(&self, compact: bool, sample: Option<usize>) -> PyResult<crate::buffer::Header> {
        Ok(crate::buffer::Header::new(featshard_exec::header::Header {
            sample,
            layout: self.placed.layout.clone(),
            buffer: self.laid_out(compact)?,
            deferred: false,
        }))
    }

    /// Sample keys carried along untouched, sorted.
    fn passthrough(&self) -> Vec<String> {
        self.placed.passthrough.keys().cloned().collect()
    }

    /// What intake did: keys dropped, semantics that arrived padded (their arrived
    /// length), owner-map rows without an owner dropped (per semantic).
    #[allow(clippy::type_complexity)]
    fn intake(
        &self,
    ) -> (
        Vec<String>,
        BTreeMap<String, usize>,
        BTreeMap<String, usize>,
    ) {
        let r = &self.placed.intake;
        (r.dropped.clone(), r.arrived.clone(), r.unowned.clone())
    }

    /// Writes the blocks of the rank at CP coordinate `coord` into `outs` (feature name,
    /// DLPack capsule of a contiguous CPU tensor of the block's dtype and shape), on
    /// `threads` threads.
    #[pyo3(signature = (coord, outs, threads = 1))]
    fn write_blocks(
        &self,
        py: Python<'_>,
        coord: Vec<usize>,
        outs: Vec<(String, Bound<'_, PyCapsule>)>,
        threads: usize,
    ) -> PyResult<()> {
        let coord = self.on_mesh(coord)?;
        self.write_part(py, Part::Block(coord), outs, threads)
    }

    /// Every placed feature's block shape at coordinate `coord` (on a domain plan, that
    /// rank's own), in `features()` order.
    fn block_shapes(&self, coord: Vec<usize>) -> PyResult<Vec<(String, Vec<usize>)>> {
        let coord = self.on_mesh(coord)?;
        let all = feature_blocks(&self.plan, &self.placed).map_err(runtime_error)?;
        Ok(all
            .iter()
            .filter(|f| f.is_placed())
            .map(|f| {
                let shape = f.shape_of(&self.placed, Part::Block(coord));
                (f.name.clone(), shape)
            })
            .collect())
    }

    /// Writes each named feature's whole padded layout (index values in the padded
    /// layout, shard-local ids not shifted) into `outs`, as `write_blocks` does blocks.
    #[pyo3(signature = (outs, threads = 1))]
    fn write_padded(
        &self,
        py: Python<'_>,
        outs: Vec<(String, Bound<'_, PyCapsule>)>,
        threads: usize,
    ) -> PyResult<()> {
        self.write_part(py, Part::Padded, outs, threads)
    }

    /// Writes each named feature as intake made it (real items only, derived features
    /// made, index values serial) into `outs`, as `write_blocks` does blocks.
    #[pyo3(signature = (outs, threads = 1))]
    fn write_serial(
        &self,
        py: Python<'_>,
        outs: Vec<(String, Bound<'_, PyCapsule>)>,
        threads: usize,
    ) -> PyResult<()> {
        self.write_part(py, Part::Serial, outs, threads)
    }

    /// Every placed feature's shape in its padded layout and as intake made it:
    /// `(name, padded shape, serial shape)`, sorted by name.
    #[allow(clippy::type_complexity)]
    fn whole_shapes(&self) -> PyResult<Vec<(String, Vec<usize>, Vec<usize>)>> {
        let all = feature_blocks(&self.plan, &self.placed).map_err(runtime_error)?;
        Ok(all
            .iter()
            .filter(|f| f.is_placed())
            .map(|f| {
                (
                    f.name.clone(),
                    f.shape_of(&self.placed, Part::Padded),
                    f.shape_of(&self.placed, Part::Serial),
                )
            })
            .collect())
    }

    /// Every placed feature's block of the rank at CP coordinate `coord`, in one buffer
    /// allocated here (huge pages advised) on `threads` threads, laid out as
    /// `buffer_layout(compact)` says: the buffer as a one-dimensional uint8 DLPack
    /// capsule.
    #[pyo3(signature = (coord, threads = 1, compact = false))]
    fn rank_buffer<'py>(
        &self,
        py: Python<'py>,
        coord: Vec<usize>,
        threads: usize,
        compact: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        if self.plan.mesh.is_domain() {
            return Err(PyValueError::new_err(format!(
                "`{}` is a domain-parallel plan: its ranks' blocks differ in shape; write each with `write_blocks`",
                self.plan.module
            )));
        }
        let at = self.on_mesh(coord.clone())?;
        let layout = self.laid_out(compact)?;
        let mut buffer = Buffer::new(layout.bytes).map_err(|e| {
            PyValueError::new_err(format!(
                "the buffer of the rank at {coord:?}: cannot allocate {} bytes ({:.2} GB): {e}",
                layout.bytes,
                layout.bytes as f64 / 1e9
            ))
        })?;
        self.inputs_alive(py)?;
        // The lock stays held while the inputs are read (see `inputs_alive`).
        let buf = buffer.bytes_mut();
        featshard_exec::buffer::fill(&self.plan, &self.placed, &layout, at, buf, threads)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        buffer.into_capsule(py)
    }
}

impl Placement {
    /// Writes `part` of each named placed feature into its output, on `threads` threads.
    fn write_part(
        &self,
        py: Python<'_>,
        part: Part,
        outs: Vec<(String, Bound<'_, PyCapsule>)>,
        threads: usize,
    ) -> PyResult<()> {
        self.inputs_alive(py)?;
        let all = feature_blocks(&self.plan, &self.placed).map_err(runtime_error)?;
        let mut jobs: Vec<(&FeatureBlocks, Memory)> = Vec::new();
        for (name, capsule) in &outs {
            let out = Memory::new(name, capsule)?;
            let f = all.iter().find(|f| &f.name == name && f.is_placed());
            let f = f.ok_or_else(|| {
                PyValueError::new_err(format!(
                    "feature `{name}`: not a placed feature of this sample"
                ))
            })?;
            let shape = f.shape_of(&self.placed, part);
            check_out(
                f,
                part,
                &shape,
                &out,
                self.inputs
                    .iter()
                    .map(|(_, m)| m)
                    .chain(jobs.iter().map(|(_, m)| m)),
            )?;
            jobs.push((f, out));
        }
        let mut slices: Vec<(&FeatureBlocks, &mut [u8])> =
            jobs.iter_mut().map(|(f, m)| (*f, m.bytes_mut())).collect();
        slices.sort_by_key(|(_, out)| std::cmp::Reverse(out.len()));
        // The lock stays held while the inputs are read (see `inputs_alive`).
        featshard_exec::par::try_each(slices, threads, |(f, out)| {
            f.write_part_into(&self.placed, part, out)
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The executor's layout of every rank's buffer of this placement.
    fn laid_out(&self, compact: bool) -> PyResult<featshard_exec::buffer::BufferLayout> {
        use featshard_exec::buffer::{block_slots, passthrough_slots};
        let mut slots = block_slots(&self.plan, &self.placed, compact).map_err(runtime_error)?;
        for mut slot in passthrough_slots(&self.placed) {
            match self.objects.get(&slot.name) {
                Some(Ok(())) => slot.encoding = Some("pickle".into()),
                Some(Err(why)) => {
                    return Err(PyValueError::new_err(format!(
                        "feature `{}`: passed through, so it rides to every rank, pickled when it is not a tensor of a spec dtype; it does not pickle: {why}",
                        slot.name
                    )))
                }
                None => {}
            }
            slots.push(slot);
        }
        Ok(featshard_exec::buffer::BufferLayout::new(slots))
    }

    /// `coord` as a mesh coordinate of this placement; `ValueError` off the mesh.
    fn on_mesh(&self, coord: Vec<usize>) -> PyResult<featshard_spec::Coord> {
        crate::coord_on(&coord, self.placed.layout.mesh, &self.plan.mesh)
    }

    /// `Err` naming the first input tensor resized or freed since the sample was
    /// placed; with the interpreter's lock held from here to the end of the read, none
    /// can be meanwhile. Reading one would read freed memory.
    fn inputs_alive(&self, py: Python<'_>) -> PyResult<()> {
        self.inputs
            .iter()
            .try_for_each(|(name, m)| m.check_alive(py, name))
    }
}

/// An output must be `part`'s dtype and `shape` and share no byte with any other view.
fn check_out<'m>(
    f: &FeatureBlocks,
    part: Part,
    shape: &[usize],
    out: &Memory,
    others: impl IntoIterator<Item = &'m Memory>,
) -> PyResult<()> {
    if out.dtype != f.dtype_of(part) || out.shape != shape {
        return Err(PyValueError::new_err(format!(
            "feature `{}`: {} is {} {:?}, the output given is {} {:?}",
            f.name,
            match part {
                Part::Block(_) => "its block",
                Part::Padded => "its padded layout",
                Part::Serial => "its taken form",
                Part::Compact(_) => "its compact block",
            },
            f.dtype_of(part).name(),
            shape,
            out.dtype.name(),
            out.shape
        )));
    }
    if others.into_iter().any(|m| m.overlaps(out)) {
        return Err(PyValueError::new_err(format!(
            "feature `{}`: the output shares memory with the sample or with another output",
            f.name
        )));
    }
    Ok(())
}
