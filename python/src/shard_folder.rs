//! A pre-sharded sample's folder as a typed object, over the executor's one home of
//! shard folders (`featshard_exec::shard_folder`): its manifest read (bounded) and
//! checked against the plan and the mesh, each rank file opened and checked once and
//! copied from that one map into one buffer. No reader here decodes the manifest's
//! JSON, hashes its layout or opens a file itself.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use featshard_exec::shard_folder::ShardFolder;
use featshard_spec::shards::{Encoding, Manifest};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

fn at(path: &std::path::Path, e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{}: {e}", path.display()))
}

/// A sample's folder and its manifest (see `Plan.shard_folder`).
#[pyclass(frozen, name = "ShardFolder", module = "featshard._native")]
pub(crate) struct PyShardFolder {
    folder: ShardFolder,
    plan: Arc<featshard_spec::Plan>,
}

/// Opens the sample folder `dir` for `plan`, refused unless sharded for the CP mesh
/// `mesh` (when given).
pub(crate) fn read(
    py: Python<'_>,
    plan: &Arc<featshard_spec::Plan>,
    dir: PathBuf,
    mesh: Option<featshard_spec::Mesh>,
) -> PyResult<PyShardFolder> {
    let folder = py
        .detach(|| ShardFolder::open(plan, &dir, mesh))
        .map_err(PyValueError::new_err)?;
    Ok(PyShardFolder {
        folder,
        plan: Arc::clone(plan),
    })
}

impl PyShardFolder {
    fn m(&self) -> &Manifest {
        self.folder.manifest()
    }
}

#[pymethods]
impl PyShardFolder {
    /// The run's identity, which each of its rank files carries.
    #[getter]
    fn run(&self) -> &str {
        &self.m().run
    }

    /// Mesh sizes, one per axis of the spec's mesh: `(cp0, cp1)` or `(cp,)`.
    #[getter]
    fn mesh<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.m().layout.mesh.sizes())
    }

    /// The workflow sharded, if one was chosen.
    #[getter]
    fn workflow(&self) -> Option<&str> {
        self.m().workflow.as_deref()
    }

    /// The SHA-256 of the layout, as each rank file's identity records it.
    #[getter]
    fn layout_sha256(&self) -> &str {
        self.folder.layout_sha256()
    }

    /// The metadata features, as text (each rank file's header holds them too).
    #[getter]
    fn metadata(&self) -> BTreeMap<String, String> {
        self.m().metadata.clone()
    }

    /// Tensor feature `name`'s DTensor global shape and stride; `None` when the rank
    /// files do not hold it as a placed feature.
    fn dtensor_shape(&self, name: &str) -> Option<(Vec<usize>, Vec<usize>)> {
        let f = self.m().features.get(name)?;
        Some((f.global_shape.clone(), f.global_stride.clone()))
    }

    /// How the rank files store blocks with a compact form: `"dense"` or `"compact"`.
    #[getter]
    fn encoding(&self) -> &'static str {
        self.m().encoding.name()
    }

    /// The slot of feature `name`'s block in a rank file when it is stored compact:
    /// its stored dtype and shape (a sparse block's rows are the file's: `[0, 2]` here),
    /// its form and its dense block's dtype and shape; `None` when it is stored as its
    /// block.
    fn stored_slot(&self, name: &str) -> Option<crate::buffer::Slot> {
        if self.m().encoding != Encoding::Compact {
            return None;
        }
        let (t, entry) = (self.plan.tensor(name)?, self.m().features.get(name)?);
        let (form, dtype, shape) = featshard_exec::compact::stored_form(t, &entry.local_shape, 0)?;
        let mut slot = featshard_exec::buffer::Slot::new(name, dtype, shape, None);
        slot.compact = Some(featshard_exec::buffer::Expansion {
            form,
            dtype: t.dtype,
            shape: entry.local_shape.clone(),
        });
        Some(crate::buffer::Slot { slot })
    }

    /// The dense blocks of the compact blocks `stored` (feature name, DLPack capsule of
    /// the tensor a rank file at `path` holds), checked and expanded by the executor into
    /// one new buffer (`expand::expand_blocks`): the buffer as a uint8 capsule, and each
    /// block's byte offset in it, in the order given.
    fn expand_stored<'py>(
        &self,
        py: Python<'py>,
        stored: Vec<(String, Bound<'py, pyo3::types::PyCapsule>)>,
        path: PathBuf,
    ) -> PyResult<(Bound<'py, PyAny>, Vec<usize>)> {
        let blocks = self.compact_blocks(stored, &path)?;
        crate::expand::expand_blocks(py, &blocks).map_err(|e| at(&path, e))
    }

    /// `ValueError` naming `path` and the feature unless every compact block of
    /// `stored` (as for `expand_stored`) is its feature's compact form, checked by the
    /// executor as `expand_stored` checks it: what a reader runs before it expands them
    /// elsewhere (with torch, on a GPU).
    fn check_stored<'py>(
        &self,
        stored: Vec<(String, Bound<'py, pyo3::types::PyCapsule>)>,
        path: PathBuf,
    ) -> PyResult<()> {
        let blocks = self.compact_blocks(stored, &path)?;
        crate::expand::check_blocks(&blocks).map_err(|e| at(&path, e))?;
        Ok(())
    }

    /// Rank `rank`'s file of this sample, checked by the executor (its identity, with
    /// `verify` its size and CRC-32, the manifest's entries and metadata, every tensor
    /// it holds) and copied from that one map into one new buffer (blocks laid out as
    /// a rank's buffer is): the buffer as a uint8 DLPack capsule, every tensor's `(name,
    /// dtype, shape, byte offset, bytes)` sorted by name, and the header's metadata (the
    /// file's identity left out). The file is unmapped before this returns.
    #[allow(clippy::type_complexity)]
    fn read_rank_file<'py>(
        &self,
        py: Python<'py>,
        rank: usize,
        verify: bool,
    ) -> PyResult<(
        Bound<'py, PyAny>,
        Vec<(String, &'static str, Vec<usize>, usize, usize)>,
        BTreeMap<String, String>,
    )> {
        let file = py
            .detach(|| self.folder.open_rank(&self.plan, rank, verify))
            .map_err(PyValueError::new_err)?;
        let (packed, total) = file.packed();
        let mut buffer = crate::dlpack::Buffer::new(total).map_err(|e| at(file.path(), e))?;
        file.copy_packed(buffer.bytes_mut())
            .map_err(PyValueError::new_err)?;
        let listed = packed
            .into_iter()
            .map(|(name, dtype, shape, at, n)| (name, dtype.name(), shape, at, n))
            .collect();
        Ok((buffer.into_capsule(py)?, listed, file.metadata()))
    }

    /// Rank `rank`'s file's path.
    fn rank_path(&self, rank: usize) -> PathBuf {
        self.folder.rank_path(rank)
    }
}

impl PyShardFolder {
    /// The compact blocks `stored` of a rank file at `path` with their features' plans
    /// and dense block shapes; a feature the manifest does not hold is refused.
    fn compact_blocks<'s, 'py>(
        &'s self,
        stored: Vec<(String, Bound<'py, pyo3::types::PyCapsule>)>,
        path: &std::path::Path,
    ) -> PyResult<Vec<crate::expand::Compact<'s, 'py>>> {
        let mut blocks = Vec::with_capacity(stored.len());
        for (name, capsule) in stored {
            let (Some(t), Some(entry)) = (self.plan.tensor(&name), self.m().features.get(&name))
            else {
                return Err(at(path, format!("feature `{name}`: not in the manifest")));
            };
            blocks.push(crate::expand::Compact {
                dense: entry.local_shape.clone(),
                name,
                plan: t,
                stored: capsule,
            });
        }
        Ok(blocks)
    }
}
