//! What a step leaves on each rank: its blocks with their DTensor metadata, and the
//! typed form a derived `<Name>Local` takes.

use std::collections::BTreeMap;

use featshard_spec::plan::SampleLayout;
use featshard_spec::Coord;

use crate::error::RuntimeError;
use crate::sample::Features;
use crate::shard::{DTensorMeta, LocalBlock};

/// This rank's part of one sample.
#[derive(Debug)]
pub struct LocalSample {
    /// Index of the sample in the serial dataset.
    pub sample: usize,
    /// The sample's layout on the CP mesh (lengths, padded lengths, owner blocks).
    pub layout: SampleLayout,
    /// This rank's CP coordinate.
    pub coord: Coord,
    /// Sorted by name, each with its DTensor metadata on `(cp0, cp1)`.
    pub blocks: BTreeMap<String, LocalBlock>,
    /// Features carried along untouched (replicated).
    pub passthrough: Features,
}

impl LocalSample {
    /// The local tensors, without metadata.
    pub fn tensors(&self) -> Features {
        self.blocks
            .iter()
            .map(|(n, b)| (n.clone(), b.tensor.shallow_clone()))
            .collect()
    }
}

/// A typed local sample (a derived `<Name>Local`) with what `DTensor.from_local`
/// and `assemble` need.
#[derive(Debug)]
pub struct Distributed<T> {
    /// The typed local blocks.
    pub local: T,
    /// Index of the sample in the serial dataset.
    pub sample: usize,
    /// The sample's layout on the mesh.
    pub layout: SampleLayout,
    /// DTensor metadata of every block, by feature name.
    pub meta: BTreeMap<String, DTensorMeta>,
}

impl LocalSample {
    /// Splits into the name -> tensor map and the rest, for a typed wrapper.
    pub fn typed<T>(
        self,
        from: impl FnOnce(Features) -> Result<T, RuntimeError>,
    ) -> Result<Distributed<T>, RuntimeError> {
        let meta = self
            .blocks
            .iter()
            .map(|(n, b)| (n.clone(), b.meta.clone()))
            .collect();
        let tensors = self
            .blocks
            .into_iter()
            .map(|(n, b)| (n, b.tensor))
            .collect();
        Ok(Distributed {
            local: from(tensors)?,
            sample: self.sample,
            layout: self.layout,
            meta,
        })
    }
}
