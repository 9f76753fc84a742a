//! A semantic in the plan: where it is sharded, how it is padded, who owns its items.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;

/// How one semantic is split and padded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SemanticPlan {
    /// Whether its axes may be split over a mesh axis.
    pub sharded: bool,
    /// The per-domain-group batch axis of a domain-parallel spec (length 1).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub batch: bool,
    /// CP mesh axes (0 = cp0, 1 = cp1) that split an axis of this semantic somewhere.
    pub sharded_on: Vec<usize>,
    /// How its run-time length becomes its padded length.
    pub padding: Padding,
    /// Mask features that are 0 at this semantic's pads.
    pub masked_by: Vec<String>,
    /// Attention window for packing, when declared.
    pub window: Option<u32>,
    /// Axes of this semantic may arrive padded: how the real items are known. The
    /// incoming pads are dropped before the layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incoming: Option<IncomingSource>,
    /// The value the owner id vector holds at the incoming pads, where it names a real
    /// owner (a collator's 0): rows holding it there are pads, not owned items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incoming_map_pad: Option<i64>,
    /// Owner-map rows without an owner are pads (dropped), not an error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unowned_rows_are_pads: bool,
    /// Who owns each item and how a sample says so, on any mesh: checked on intake
    /// (counts against the map, rows without an owner) whatever the layout. On a 2-D
    /// tile the items are laid out in owner blocks (`padding`); on one axis, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_by: Option<OwnedBy>,
    /// Every shard of this semantic's axes is a multiple of `stride` long.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub stride: u32,
    /// Every shard of this semantic's axes is at least `halo` long.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub halo: u32,
}

/// An owned semantic's owner, the root of its ownership tree, and how a sample gives
/// each item's owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OwnedBy {
    /// Direct owner semantic.
    pub owner: String,
    /// Root of the ownership tree.
    pub root: String,
    /// How the sample gives each item's owner.
    pub source: OwnerSource,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl SemanticPlan {
    /// Whether the `torch.chunk` pieces of an uneven axis meet the stride and halo.
    pub fn admits_shards(&self, sizes: &[usize]) -> bool {
        let stride = self.stride.max(1) as usize;
        sizes
            .iter()
            .all(|&n| n % stride == 0 && n >= self.halo as usize)
    }
}

/// How a semantic's run-time length becomes its padded length.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Padding {
    /// Never padded.
    None,
    /// Padded at the end to a multiple of the lcm of these mesh axes' sizes (and of
    /// the window, when one is given).
    Multiple {
        /// The mesh axes that split it.
        mesh_axes: Vec<usize>,
        /// An attention window the padded length is a multiple of too (an owned
        /// semantic on a one-axis CP mesh, laid out in serial order).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u32>,
        /// `layout: windows`: every shard a whole number of windows (the padded length a
        /// multiple of the window times the mesh axes' lcm), not only the axis.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        whole_windows: bool,
    },
    /// Owner-partitioned: the root owner's padded axis is split into lcm(mesh_axes)
    /// equal blocks; each block holds its owners' items, padded to the largest block.
    OwnerBlocks {
        /// Direct owner semantic.
        owner: String,
        /// Root of the ownership tree (the semantic whose blocks are counted).
        root: String,
        /// How the sample gives each item's owner.
        source: OwnerSource,
        /// The mesh axes whose sizes set the block count.
        mesh_axes: Vec<usize>,
    },
}
