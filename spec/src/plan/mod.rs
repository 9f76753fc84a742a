//! The Plan IR: the rules every front end and runtime executes.
//!
//! A plan holds no sample sizes. Given the mesh sizes, the run-time lengths and, for
//! owner-partitioned semantics, the owner counts, [`Plan::resolve`] yields every
//! feature's padded shape, DTensor global shape, per-rank local shape and pad value.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::infer::{Split, CP_AXES};
use crate::ir::*;
use crate::layout::BlockLayout;
use crate::ownership::chain;

mod build;
pub mod integrity;
mod resolve;
mod symbolic;

pub use build::plan;
pub use resolve::{
    FeatureShapes, Lengths, Ownership, ResolveError, Resolved, RootCounts, SampleLayout,
    ShardBreach,
};
pub use symbolic::{spread_evenly, Extent, SymbolicShapes};

/// Version of the plan.json format.
pub const PLAN_VERSION: u32 = 1;

/// The plan of a whole spec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Format version of this document (currently 1).
    pub version: u32,
    /// Name of the generated modules.
    pub module: String,
    /// Where the spec came from.
    pub source: Source,
    /// The mesh axes and how they split a sample.
    pub mesh: MeshPlan,
    /// Every semantic's plan, by name.
    pub semantics: BTreeMap<String, SemanticPlan>,
    /// Every feature's plan, by name.
    pub features: BTreeMap<String, FeaturePlan>,
    /// Workflow -> sorted feature names (base set plus the workflow's own).
    pub workflows: BTreeMap<String, Vec<String>>,
    /// What happens to sample keys that are not features.
    #[serde(default)]
    pub inputs: InputsPlan,
}

/// How a sample's keys that the spec does not place are treated.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputsPlan {
    /// Keys that are neither features nor in `drop`: refused, dropped or passed.
    pub other_keys: KeyPolicy,
    /// Keys removed from every sample, sorted.
    pub drop: Vec<String>,
}

/// The mesh of a plan: the axes that split a sample, how, and the DP axis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "MeshRepr", into = "MeshRepr")]
pub struct MeshPlan {
    /// The axes one sample is split over, and how.
    pub split: SplitPlan,
    /// Name of the data-parallel axis, prepended by collate.
    pub dp: Option<String>,
}

/// Where a device mesh's DP axis and sample axes are ([`MeshPlan::dims`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshDims {
    /// The DP dimension, if the device mesh has one.
    pub dp: Option<usize>,
    /// The dimensions that split a sample, in the spec's order.
    pub sample: Vec<usize>,
}

/// How one sample is split: the CP axes `(cp0, cp1)` or `(cp,)` (DTensor blocks,
/// padded), or the one or two axes of a domain-parallel mesh (ShardTensors; uneven
/// axes chunked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SplitPlan {
    /// The context-parallel axes: `(cp0, cp1)`, or one axis `(cp,)`.
    Cp(Vec<String>),
    /// The one or two axes of a domain-parallel mesh.
    Domain {
        /// The axes, in order.
        axes: Vec<String>,
        /// Per axis: shards are `torch.chunk` pieces (uneven) rather than padded.
        uneven: Vec<bool>,
    },
}

impl MeshPlan {
    /// The names of the axes that split a sample; indices in the plan refer to this order.
    pub fn axes(&self) -> &[String] {
        match &self.split {
            SplitPlan::Cp(axes) => axes,
            SplitPlan::Domain { axes, .. } => axes,
        }
    }

    /// Whether this is a domain-parallel (ShardTensor) mesh.
    pub fn is_domain(&self) -> bool {
        matches!(self.split, SplitPlan::Domain { .. })
    }

    /// Whether this is a one-axis CP mesh `(cp,)`.
    pub fn is_cp_1d(&self) -> bool {
        matches!(&self.split, SplitPlan::Cp(axes) if axes.len() == 1)
    }

    /// Which dimensions of a device mesh of `ndim` dimensions named `names` are the
    /// DP axis and the sample's axes, found by the spec's names for them: the DP axis
    /// first when there is one, then the sample's axes in order. A mesh without names
    /// must be the sample's axes alone. Anything else is refused by name: a DP axis
    /// guessed from a dimension count would give two replicas the same samples.
    pub fn dims(&self, names: Option<&[String]>, ndim: usize) -> Result<MeshDims, String> {
        let axes = self.axes();
        let expected = || {
            let dp = self.dp.iter().map(|d| format!("{d}, "));
            format!("({}{})", dp.collect::<String>(), axes.join(", "))
        };
        let Some(names) = names else {
            if ndim == axes.len() {
                return Ok(MeshDims {
                    dp: None,
                    sample: (0..ndim).collect(),
                });
            }
            return Err(format!(
                "a device mesh of {ndim} dimensions without names: name its dimensions (mesh_dim_names) after the spec's mesh {}",
                expected()
            ));
        };
        if let Some(n) = names
            .iter()
            .find(|n| !axes.contains(n) && self.dp.as_ref() != Some(n))
        {
            return Err(format!(
                "device mesh dimension `{n}` is not an axis of the spec's mesh {}",
                expected()
            ));
        }
        let dp = self
            .dp
            .as_ref()
            .and_then(|d| names.iter().position(|n| n == d));
        let start = usize::from(dp.is_some());
        if dp.is_some_and(|d| d != 0) || names[start..] != *axes || names.len() != ndim {
            return Err(format!(
                "device mesh dimensions ({}) are not the spec's mesh {} in its order",
                names.join(", "),
                expected()
            ));
        }
        Ok(MeshDims {
            dp,
            sample: (start..ndim).collect(),
        })
    }

    /// Whether mesh axis `m` splits into uneven chunks (only a domain axis can).
    pub fn uneven(&self, m: usize) -> bool {
        match &self.split {
            SplitPlan::Cp(_) => false,
            SplitPlan::Domain { uneven, .. } => uneven.get(m).copied().unwrap_or(false),
        }
    }
}

/// The extent of each of `ranks` shards of an axis of `len` items on an uneven mesh
/// axis: `torch.chunk` sizes (`ceil(len / ranks)`, the last one smaller), which is how
/// ShardTensor splits a replicated tensor. `None` when a shard would be empty.
pub fn chunk_sizes(len: usize, ranks: usize) -> Option<Vec<usize>> {
    if ranks == 0 || len < ranks {
        return None;
    }
    let chunk = len.div_ceil(ranks);
    let last = len.checked_sub(chunk * (ranks - 1)).filter(|&n| n > 0)?;
    Some(
        std::iter::repeat_n(chunk, ranks - 1)
            .chain(std::iter::once(last))
            .collect(),
    )
}

/// The mesh as plan files write it (`cp`, `dp`, and `domain` for a domain mesh).
#[derive(Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct MeshRepr {
    /// Names of the CP mesh axes `(cp0, cp1)`; indices in the plan refer to this order.
    /// For a domain-parallel spec, its one or two domain axes.
    cp: Vec<String>,
    /// Name of the data-parallel axis, prepended by collate.
    dp: Option<String>,
    /// Set for a domain-parallel (PhysicsNeMo ShardTensor) spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    domain: Option<DomainRepr>,
}

/// A domain-parallel mesh: inputs become ShardTensors, shards may be uneven.
#[derive(Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct DomainRepr {
    /// Per mesh axis: shards are `torch.chunk` pieces (uneven) rather than padded.
    uneven: Vec<bool>,
}

impl TryFrom<MeshRepr> for MeshPlan {
    type Error = String;

    fn try_from(r: MeshRepr) -> Result<Self, String> {
        let split = match r.domain {
            None if (1..=CP_AXES).contains(&r.cp.len()) => SplitPlan::Cp(r.cp),
            None => {
                return Err(format!(
                    "a CP mesh has one or two axes, this plan names {}",
                    r.cp.len()
                ))
            }
            Some(d) if d.uneven.len() == r.cp.len() && (1..=2).contains(&r.cp.len()) => {
                SplitPlan::Domain {
                    axes: r.cp,
                    uneven: d.uneven,
                }
            }
            Some(d) => {
                return Err(format!(
                    "a domain mesh has one or two axes, each even or uneven; this plan names {} axes and {} flags",
                    r.cp.len(),
                    d.uneven.len()
                ))
            }
        };
        Ok(MeshPlan { split, dp: r.dp })
    }
}

impl From<MeshPlan> for MeshRepr {
    fn from(m: MeshPlan) -> Self {
        let (cp, domain) = match m.split {
            SplitPlan::Cp(axes) => (axes, None),
            SplitPlan::Domain { axes, uneven } => (axes, Some(DomainRepr { uneven })),
        };
        MeshRepr {
            cp,
            dp: m.dp,
            domain,
        }
    }
}

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
    pub fn block_window(&self, local: &[usize], coord: [usize; CP_AXES]) -> Vec<(usize, usize)> {
        self.axes
            .iter()
            .zip(local)
            .map(|(a, &n)| match a.split.mesh_axis() {
                Some(m) => (coord[m] * n, n),
                None => (0, n),
            })
            .collect()
    }

    /// [`TensorPlan::block_window`], `None` when a window's end would not fit a `usize`
    /// (a coordinate no mesh has).
    pub fn checked_block_window(
        &self,
        local: &[usize],
        coord: [usize; CP_AXES],
    ) -> Option<Vec<(usize, usize)>> {
        self.axes
            .iter()
            .zip(local)
            .map(|(a, &n)| match a.split.mesh_axis() {
                Some(m) => coord[m]
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
        cp: [usize; CP_AXES],
    ) -> Vec<usize> {
        let mut shape = vec![batch * dp];
        shape.extend(self.axes.iter().zip(local).map(|(a, &n)| match a.split {
            Split::Mesh { mesh_axis } => n * cp[mesh_axis],
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

/// The JSON Schema (draft-07) of plan.json.
pub fn json_schema() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft07().into_generator();
    let schema = generator.into_root_schema_for::<Plan>();
    serde_json::to_value(schema).unwrap_or(serde_json::Value::Null)
}

impl Plan {
    /// The tensor feature `name`; `None` for metadata and for names not in the spec.
    pub fn tensor(&self, name: &str) -> Option<&TensorPlan> {
        match self.features.get(name) {
            Some(FeaturePlan::Tensor(t)) => Some(t),
            _ => None,
        }
    }

    /// Tensor features, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &TensorPlan)> {
        self.features.iter().filter_map(|(n, f)| match f {
            FeaturePlan::Tensor(t) => Some((n.as_str(), t.as_ref())),
            FeaturePlan::Metadata { .. } => None,
        })
    }

    /// Feature names of a workflow, or of the whole spec for `None`.
    pub fn feature_names(&self, workflow: Option<&str>) -> Result<Vec<&str>, ResolveError> {
        match workflow {
            None => Ok(self.features.keys().map(String::as_str).collect()),
            Some(w) => self
                .workflows
                .get(w)
                .map(|fs| fs.iter().map(String::as_str).collect())
                .ok_or_else(|| ResolveError::UnknownWorkflow {
                    workflow: w.to_owned(),
                }),
        }
    }

    /// The local length of `semantic` along its first mesh-split axis, in the first of
    /// `shapes` (feature name -> local shape, in name order) that has such an axis.
    pub fn mesh_split_length<'a>(
        &self,
        semantic: &str,
        shapes: impl IntoIterator<Item = (&'a str, &'a [usize])>,
    ) -> Option<usize> {
        shapes.into_iter().find_map(|(name, shape)| {
            let t = self.tensor(name)?;
            t.axes.iter().zip(shape).find_map(|(a, &n)| {
                (a.semantic.as_deref() == Some(semantic) && matches!(a.split, Split::Mesh { .. }))
                    .then_some(n)
            })
        })
    }

    /// DP collate's re-pad of feature `name`, an index into an owner-partitioned layout:
    /// the per-block stride `(old, new)` of the semantic it points into, read off the
    /// sample's local shapes and the batch's agreed ones (`None` when the feature is not
    /// re-padded or no feature splits that semantic).
    pub fn repad_strides<'a, 'b>(
        &self,
        name: &str,
        local: impl IntoIterator<Item = (&'a str, &'a [usize])>,
        target: impl IntoIterator<Item = (&'b str, &'b [usize])>,
    ) -> Option<(usize, usize)> {
        let t = self.tensor(name)?;
        let Remap::ToPaddedLayout { of, repad: true } = &t.remap else {
            return None;
        };
        Some((
            self.mesh_split_length(of, local)?,
            self.mesh_split_length(of, target)?,
        ))
    }

    /// Semantics with every owner before what it owns, ties in name order.
    pub fn semantic_order(&self) -> Vec<&str> {
        let owner_of = |name: &str| {
            let owned = self.semantics.get(name)?.owned_by.as_ref()?;
            Some(owned.owner.as_str())
        };
        let depth = |name: &str| chain(name, owner_of, self.semantics.len()).len();
        let mut order: Vec<&str> = self.semantics.keys().map(String::as_str).collect();
        order.sort_by_key(|s| (depth(s), *s));
        order
    }
}

#[cfg(test)]
mod tests {
    use crate::layout::coords;

    const SPEC: &str = "\
version: 1
module: t
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true}
features:
  pair: {axes: [tokens, tokens, 4], dtype: float32}
  owner: {axes: [tokens, tokens], dtype: int64, coshard: [{axis: 1, follows: 0}], index: {of: tokens, scope: shard_local, one_hot: 1}}
";

    /// Every rank's block windows tile the split axes exactly once (a co-sharded axis
    /// follows its leader onto the diagonal), and collate's global shape is the mesh
    /// times the local block on split axes only.
    #[test]
    fn block_windows_tile_the_padded_layout_and_collate_scales_split_axes() {
        let (_, plan) = crate::compile_str("t.yaml", SPEC).expect("spec");
        let super::FeaturePlan::Tensor(pair) = &plan.features["pair"] else {
            panic!("pair is a tensor")
        };
        let super::FeaturePlan::Tensor(owner) = &plan.features["owner"] else {
            panic!("owner is a tensor")
        };
        // A padded length every mesh divides.
        const N: usize = 12;
        for mesh in [[1, 1], [2, 3], [3, 2], [4, 1]] {
            let local = [N / mesh[0], N / mesh[1], 4];
            let world = mesh[0] * mesh[1];
            let mut cover = vec![vec![0; N]; N];
            for rank in 0..world {
                let c = coords(mesh, rank);
                assert_eq!(c[0] * mesh[1] + c[1], rank);
                let w = pair.block_window(&local, c);
                assert_eq!(w[2], (0, 4));
                for row in &mut cover[w[0].0..w[0].0 + w[0].1] {
                    for n in &mut row[w[1].0..w[1].0 + w[1].1] {
                        *n += 1;
                    }
                }
                let d = owner.block_window(&[N / mesh[0], N / mesh[0]], c);
                assert_eq!(d[0], d[1], "a co-sharded axis takes its leader's block");
            }
            assert!(
                cover.iter().flatten().all(|&n| n == 1),
                "mesh {mesh:?}: {cover:?}"
            );
            assert_eq!(
                pair.collated_global_shape(&local, 2, 3, mesh),
                vec![6, N, N, 4]
            );
            let diag = [N / mesh[0], N / mesh[0]];
            assert_eq!(
                owner.collated_global_shape(&diag, 1, 1, mesh),
                vec![1, N, N / mesh[0]]
            );
        }
    }

    /// An owned semantic whose owner has no length is refused naming both, whether
    /// the lengths come with counts (`resolve`) or with each item's owner (`layout`).
    #[test]
    fn a_missing_owner_length_names_the_owned_semantic_and_its_owner() {
        let spec = "\
version: 1
module: t
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true}
  atoms: {shard: true, owner: tokens, counts: atoms_per_token}
features:
  atoms_per_token: {axes: [tokens], dtype: int64}
  coords: {axes: [atoms, 3], dtype: float32}
";
        let (_, plan) = crate::compile_str("t.yaml", spec).expect("spec");
        let expected = super::ResolveError::MissingOwnerLength {
            semantic: "atoms".into(),
            owner: "tokens".into(),
        };
        let lengths = super::Lengths {
            sizes: [("atoms".to_owned(), 4)].into(),
            counts: [("atoms".to_owned(), super::RootCounts::Each(vec![2, 2]))].into(),
        };
        assert_eq!(plan.resolve([2, 1], &lengths, None), Err(expected.clone()));
        let owners = [(
            "atoms".to_owned(),
            super::Ownership::Owners(vec![0, 0, 1, 1]),
        )]
        .into();
        assert_eq!(
            plan.layout([2, 1], &lengths.sizes, &owners),
            Err(expected.clone())
        );
        assert!(expected
            .to_string()
            .contains("no run-time length was given for `tokens`"));
    }

    /// Collate re-pads an index into an owner-partitioned layout by the per-block stride
    /// of the semantic it points into, read off the first feature that splits it; other
    /// features are not re-padded.
    #[test]
    fn repad_strides_read_the_indexed_semantic_off_local_and_target_shapes() {
        let spec = "\
version: 1
module: t
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true}
  atoms: {shard: true, owner: tokens, counts: atoms_per_token}
features:
  atoms_per_token: {axes: [tokens], dtype: int64}
  coords: {axes: [atoms, 3], dtype: float32}
  frames: {axes: [tokens, 3], dtype: int64, index: {of: atoms, scope: padded_global}}
";
        let (_, plan) = crate::compile_str("t.yaml", spec).expect("spec");
        let local: [(&str, &[usize]); 3] = [
            ("atoms_per_token", &[4]),
            ("coords", &[12, 3]),
            ("frames", &[4, 3]),
        ];
        let target: [(&str, &[usize]); 3] = [
            ("atoms_per_token", &[5]),
            ("coords", &[16, 3]),
            ("frames", &[5, 3]),
        ];
        assert_eq!(plan.repad_strides("frames", local, target), Some((12, 16)));
        assert_eq!(plan.repad_strides("coords", local, target), None);
        assert_eq!(plan.mesh_split_length("tokens", local), Some(4));
        assert_eq!(
            plan.repad_strides("frames", local, [("frames", &[5usize, 3][..])]),
            None
        );
    }
}
