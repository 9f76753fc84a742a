//! A feature in the plan: its axes and their splits, placements, pad value, role and
//! index remap, and the windows of its blocks.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;
use crate::mesh::{Coord, Mesh};

/// One feature of the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FeaturePlan {
    /// A tensor, placed and padded.
    Tensor(Box<TensorPlan>),
    /// Passed through untouched.
    Metadata {
        /// The workflows it belongs to.
        workflows: Vec<String>,
        /// A sample may lack it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        optional: bool,
    },
}

/// How one tensor feature is placed, padded and remapped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TensorPlan {
    /// Its element type.
    pub dtype: DType,
    /// Each axis: what it counts and how it is split.
    pub axes: Vec<AxisPlan>,
    /// Placements on the CP sub-mesh `(cp0, cp1)`.
    pub placements: Vec<Placement>,
    /// Placements on `(dp, cp0, cp1)` after collate adds the batch dimension.
    pub placements_dp: Vec<Placement>,
    /// The value at pad positions.
    pub pad_value: PadValue,
    /// Plain data, a mask or an index.
    pub role: Role,
    /// A channel axis holding a one-hot encoding over its size's classes (each row
    /// along it one 1, or none in a pad row): it travels and rests as indices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_hot: Option<usize>,
    /// Mostly zero: a block travels and rests as its nonzero entries.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sparse: bool,
    /// Every value (pads too) lies in `[lo, hi]`: a block travels and rests in the
    /// smallest integer type holding the range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<[i64; 2]>,
    /// How index values change when padded and sharded.
    pub remap: Remap,
    /// The workflows it belongs to.
    pub workflows: Vec<String>,
    /// A sample may lack it; when present it is placed and checked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// Made by the pipeline from other features (checked against them when given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derived: Option<DeriveRule>,
    /// A model parameter of a domain spec placed like the inputs; not an input.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub parameter: bool,
    /// A model output of a domain spec placed like the inputs; not an input.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output: bool,
    /// The form the sample gives it in, where the spec delivers it in another: intake
    /// makes this feature from it, and the serial sample `assemble` writes has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub given: Option<GivenForm>,
}

impl TensorPlan {
    /// The part of `window` (`(start, len)` per axis of the padded layout) that holds
    /// real items, `(start, stop)` per axis: a semantic's axis stops at its real length
    /// in `lengths` (0 when not given), a channel at its size; an axis with no real item
    /// in the window is empty at its start.
    pub fn real_window(
        &self,
        window: &[(usize, usize)],
        lengths: &BTreeMap<String, usize>,
    ) -> Vec<(usize, usize)> {
        self.axes
            .iter()
            .zip(window)
            .map(|(a, &(start, len))| {
                let real = match &a.semantic {
                    Some(s) => lengths.get(s).copied().unwrap_or(0),
                    None => usize::try_from(a.size.unwrap_or(0)).unwrap_or(usize::MAX),
                };
                (start, start.saturating_add(len).min(real).max(start))
            })
            .collect()
    }

    /// The region of the feature's padded layout that the rank at CP mesh coordinate
    /// `coord` holds, `(start, len)` per axis, for local block shape `local`: a split
    /// axis takes the block of its mesh axis' coordinate (a co-sharded axis its
    /// leader's, which keeps the diagonal block), a whole axis all of it.
    pub fn block_window(&self, local: &[usize], coord: Coord) -> Vec<(usize, usize)> {
        self.axes
            .iter()
            .zip(local)
            .map(|(a, &n)| match a.split.mesh_axis() {
                Some(m) => (coord.get(m) * n, n),
                None => (0, n),
            })
            .collect()
    }

    /// [`TensorPlan::block_window`], `None` when a window's end would not fit a `usize`
    /// (a coordinate no mesh has).
    pub fn checked_block_window(
        &self,
        local: &[usize],
        coord: Coord,
    ) -> Option<Vec<(usize, usize)>> {
        self.axes
            .iter()
            .zip(local)
            .map(|(a, &n)| match a.split.mesh_axis() {
                Some(m) => coord
                    .get(m)
                    .checked_mul(n)
                    .filter(|s| s.checked_add(n).is_some())
                    .map(|s| (s, n)),
                None => Some((0, n)),
            })
            .collect()
    }

    /// The DTensor global shape of a DP batch of `batch` samples per replica on `dp`
    /// replicas, whose local blocks were padded to `local`: the batch axis first, then
    /// every split axis `cp` times its local length (a co-sharded axis keeps its
    /// diagonal block's), every other axis as it is.
    pub fn collated_global_shape(
        &self,
        local: &[usize],
        batch: usize,
        dp: usize,
        cp: Mesh,
    ) -> Vec<usize> {
        let mut shape = vec![batch * dp];
        shape.extend(self.axes.iter().zip(local).map(|(a, &n)| match a.split {
            Split::Mesh { mesh_axis } => n * cp.size(mesh_axis),
            _ => n,
        }));
        shape
    }
}

/// One axis of a tensor feature in the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AxisPlan {
    /// The axis semantic, or `null` for a channel axis.
    pub semantic: Option<String>,
    /// Fixed size of a channel axis.
    pub size: Option<u64>,
    /// How it is split over the mesh.
    pub split: Split,
}

/// How index values change when the sample is padded and sharded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Remap {
    /// Values kept as they are.
    None,
    /// Values become positions in the padded layout of `of`. When `repad` is true the
    /// layout is owner-partitioned and a larger per-block stride at collate remaps
    /// `new = (idx // old) * new_stride + idx % old`.
    ToPaddedLayout {
        /// The semantic whose items the values point at.
        of: String,
        /// Whether collate re-pads them (an owner-partitioned layout).
        repad: bool,
    },
    /// Values become ids local to the shard along `mesh_axis` that holds the row.
    ShardLocal {
        /// The semantic whose items the values point at.
        of: String,
        /// The mesh axis whose shards number the ids.
        mesh_axis: usize,
    },
    /// One-hot along co-sharded `axis`: each rank keeps its diagonal block, so column
    /// ids are local to the shard along `mesh_axis`.
    DiagonalBlock {
        /// The semantic whose items the columns point at.
        of: String,
        /// The one-hot (co-sharded) axis.
        axis: usize,
        /// The mesh axis whose shards number the columns.
        mesh_axis: usize,
    },
}
