//! One sample on one mesh: its lengths, padded lengths and owner-block positions.

use std::collections::BTreeMap;

use super::*;
use crate::mesh::{Coord, Mesh};

/// Who owns each item of an owner-partitioned semantic, as a sample gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Items per direct owner, in owner order (from a `counts` feature).
    Counts(Vec<usize>),
    /// The direct owner of every item (from a one-hot `map` feature).
    Owners(Vec<usize>),
}

/// One sample laid out on one mesh.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SampleLayout {
    /// Mesh sizes `(cp0, cp1)`.
    pub mesh: Mesh,
    /// Serial length of every semantic present.
    pub sizes: BTreeMap<String, usize>,
    /// Padded length of every semantic present.
    pub padded: BTreeMap<String, usize>,
    /// Owner-partitioned semantics: the padded position of every item, in serial order.
    pub positions: BTreeMap<String, Vec<usize>>,
    /// Block layout of every owner-partitioned semantic.
    pub blocks: BTreeMap<String, BlockLayout>,
}

impl SampleLayout {
    /// Where the shard of `semantic` along `mesh_axis` at CP coordinate `coord` starts
    /// in its padded layout (what a shard-local id is counted from); `None` when the
    /// layout has no length for it.
    pub fn shard_start(&self, semantic: &str, mesh_axis: usize, coord: Coord) -> Option<usize> {
        let padded = *self.padded.get(semantic)?;
        Some(coord.get(mesh_axis) * (padded / self.mesh.size(mesh_axis).max(1)))
    }

    /// The shard along `mesh_axis` that holds padded position `position` of `semantic`;
    /// `None` when the layout has no length for it.
    pub fn shard_of(&self, semantic: &str, mesh_axis: usize, position: usize) -> Option<usize> {
        let padded = *self.padded.get(semantic)?;
        let block = padded / self.mesh.size(mesh_axis);
        Some(position / block.max(1))
    }
}
