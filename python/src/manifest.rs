//! A pre-sharded sample's `manifest.json` as a typed object: read and checked against
//! the plan by the spec crate (every feature entry what the plan makes of the layout),
//! its layout digest computed here, and a rank file's size and CRC-32 checked against
//! it. No reader decodes the manifest's JSON or hashes its layout itself.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use featshard::manifest::{self, Manifest};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

fn at(path: &std::path::Path, e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{}: {e}", path.display()))
}

/// A sample's manifest (see `Plan.read_manifest`).
#[pyclass(frozen, module = "featshard._native")]
pub(crate) struct ShardManifest {
    m: Manifest,
    layout_sha256: String,
    plan: Arc<featshard_spec::Plan>,
}

/// Reads and checks the manifest at `path` for `plan`.
pub(crate) fn read(
    py: Python<'_>,
    plan: &Arc<featshard_spec::Plan>,
    path: PathBuf,
) -> PyResult<ShardManifest> {
    py.detach(|| {
        let text = manifest::read_text(&path)?;
        let m = manifest::parse(&text, plan)?;
        let layout_sha256 = manifest::layout_digest(&m.layout)?;
        Ok(ShardManifest {
            m,
            layout_sha256,
            plan: Arc::clone(plan),
        })
    })
    .map_err(|e: String| at(&path, e))
}

#[pymethods]
impl ShardManifest {
    /// The run's identity, which each of its rank files carries.
    #[getter]
    fn run(&self) -> &str {
        &self.m.run
    }

    /// Mesh sizes, one per axis of the spec's mesh: `(cp0, cp1)` or `(cp,)`.
    #[getter]
    fn mesh<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let axes = self.plan.mesh.axes().len().clamp(1, 2);
        PyTuple::new(py, &self.m.mesh[..axes])
    }

    /// The workflow sharded, if one was chosen.
    #[getter]
    fn workflow(&self) -> Option<&str> {
        self.m.workflow.as_deref()
    }

    /// The SHA-256 of the layout, as each rank file's identity records it.
    #[getter]
    fn layout_sha256(&self) -> &str {
        &self.layout_sha256
    }

    /// The metadata features, as text (each rank file's header holds them too).
    #[getter]
    fn metadata(&self) -> BTreeMap<String, String> {
        self.m.metadata.clone()
    }

    /// Tensor feature `name`'s DTensor global shape and stride; `None` when the rank
    /// files do not hold it as a placed feature.
    fn dtensor_shape(&self, name: &str) -> Option<(Vec<usize>, Vec<usize>)> {
        let f = self.m.features.get(name)?;
        Some((f.global_shape.clone(), f.global_stride.clone()))
    }

    /// How the rank files store blocks with a compact form: `"dense"` or `"compact"`.
    #[getter]
    fn encoding(&self) -> &'static str {
        self.m.encoding.name()
    }

    /// The slot of feature `name`'s block in a rank file when it is stored compact:
    /// its stored dtype and shape (a sparse block's rows are the file's: `[0, 2]` here),
    /// its form and its dense block's dtype and shape; `None` when it is stored as its
    /// block.
    fn stored_slot(&self, name: &str) -> Option<crate::buffer::Slot> {
        if self.m.encoding != featshard::manifest::Encoding::Compact {
            return None;
        }
        let (t, entry) = (self.plan.tensor(name)?, self.m.features.get(name)?);
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

    /// The rank file at `path`, rank `rank` of this sample, checked by the one reader
    /// of rank files (`featshard_exec::rank_file::open_checked`: identity, with
    /// `verify` its size and CRC-32, the manifest's entries and metadata, every tensor
    /// it holds) and read into one new buffer (blocks laid out as a
    /// rank's buffer is): the buffer as a uint8 DLPack capsule, every tensor's `(name,
    /// dtype, shape, byte offset, bytes)` sorted by name, and the header's metadata (the
    /// file's identity left out). The file is unmapped before this returns.
    #[allow(clippy::type_complexity)]
    fn read_rank_file<'py>(
        &self,
        py: Python<'py>,
        path: PathBuf,
        rank: usize,
        verify: bool,
    ) -> PyResult<(
        Bound<'py, PyAny>,
        Vec<(String, &'static str, Vec<usize>, usize, usize)>,
        BTreeMap<String, String>,
    )> {
        let file = py
            .detach(|| {
                featshard_exec::rank_file::open_checked(
                    &self.plan,
                    &self.m,
                    &self.layout_sha256,
                    &path,
                    rank,
                    verify,
                )
            })
            .map_err(PyValueError::new_err)?;
        let header = file.header();
        let sizes: Vec<usize> = header
            .entries
            .iter()
            .map(|e| (e.offsets.1 - e.offsets.0) as usize)
            .collect();
        let (offsets, total) = featshard_exec::buffer::packed(&sizes);
        let mut buffer = crate::dlpack::Buffer::new(total).map_err(|e| at(&path, e))?;
        let out = buffer.bytes_mut();
        let data = &file.bytes()[header.data_start as usize..];
        let mut listed = Vec::with_capacity(sizes.len());
        let mut end = 0;
        for (e, &at) in header.entries.iter().zip(&offsets) {
            let (a, b) = (e.offsets.0 as usize, e.offsets.1 as usize);
            // Recycled memory: the alignment gaps are zeroed, each tensor copied whole.
            out[end..at].fill(0);
            out[at..at + (b - a)].copy_from_slice(&data[a..b]);
            end = at + (b - a);
            listed.push((e.name.clone(), e.dtype.name(), e.shape.clone(), at, b - a));
        }
        file.check_unchanged(&path).map_err(|e| at(&path, e))?;
        let mut metadata = header.metadata.clone();
        metadata.remove(featshard::manifest::RANK_KEY);
        Ok((buffer.into_capsule(py)?, listed, metadata))
    }
}

impl ShardManifest {
    /// The compact blocks `stored` of a rank file at `path` with their features' plans
    /// and dense block shapes; a feature the manifest does not hold is refused.
    fn compact_blocks<'s, 'py>(
        &'s self,
        stored: Vec<(String, Bound<'py, pyo3::types::PyCapsule>)>,
        path: &std::path::Path,
    ) -> PyResult<Vec<crate::expand::Compact<'s, 'py>>> {
        let mut blocks = Vec::with_capacity(stored.len());
        for (name, capsule) in stored {
            let (Some(t), Some(entry)) = (self.plan.tensor(&name), self.m.features.get(&name))
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
