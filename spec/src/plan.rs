//! The Plan IR: the rules every front end and runtime executes.
//!
//! A plan holds no sample sizes. Given the mesh sizes, the run-time lengths and, for
//! owner-partitioned semantics, the owner counts, [`Plan::resolve`] yields every
//! feature's padded shape, DTensor global shape, per-rank local shape and pad value.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::check;
use crate::diag::SpecError;
use crate::infer::{self, Split, CP_AXES};
use crate::ir::*;
use crate::layout::{lcm_of, owner_block, round_up, BlockLayout};

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
    pub source: Source,
    pub mesh: MeshPlan,
    pub semantics: BTreeMap<String, SemanticPlan>,
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MeshPlan {
    /// Names of the CP mesh axes `(cp0, cp1)`; indices in the plan refer to this order.
    /// For a domain-parallel spec, its one or two domain axes.
    pub cp: Vec<String>,
    /// Name of the data-parallel axis, prepended by collate.
    pub dp: Option<String>,
    /// Set for a domain-parallel (PhysicsNeMo ShardTensor) spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<DomainPlan>,
}

/// A domain-parallel mesh: inputs become ShardTensors, shards may be uneven.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DomainPlan {
    /// Per mesh axis: shards are `torch.chunk` pieces (uneven) rather than padded.
    pub uneven: Vec<bool>,
}

impl DomainPlan {
    /// The extent of each of `ranks` shards of an axis of `len` items on an uneven mesh
    /// axis: `torch.chunk` sizes (`ceil(len / ranks)`, the last one smaller), which is
    /// how ShardTensor splits a replicated tensor. `None` when a shard would be empty.
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
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SemanticPlan {
    pub sharded: bool,
    /// The per-domain-group batch axis of a domain-parallel spec (length 1).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub batch: bool,
    /// CP mesh axes (0 = cp0, 1 = cp1) that split an axis of this semantic somewhere.
    pub sharded_on: Vec<usize>,
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
    /// Every shard of this semantic's axes is a multiple of `stride` long.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub stride: u32,
    /// Every shard of this semantic's axes is at least `halo` long.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub halo: u32,
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
    /// Padded at the end to a multiple of the lcm of these mesh axes' sizes.
    Multiple { mesh_axes: Vec<usize> },
    /// Owner-partitioned: the root owner's padded axis is split into lcm(mesh_axes)
    /// equal blocks; each block holds its owners' items, padded to the largest block.
    OwnerBlocks {
        /// Direct owner semantic.
        owner: String,
        /// Root of the ownership tree (the semantic whose blocks are counted).
        root: String,
        /// How the sample gives each item's owner.
        source: OwnerSource,
        mesh_axes: Vec<usize>,
    },
}

/// One feature of the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FeaturePlan {
    Tensor(Box<TensorPlan>),
    /// Passed through untouched.
    Metadata {
        workflows: Vec<String>,
        /// A sample may lack it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        optional: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TensorPlan {
    pub dtype: DType,
    pub axes: Vec<AxisPlan>,
    /// Placements on the CP sub-mesh `(cp0, cp1)`.
    pub placements: Vec<Placement>,
    /// Placements on `(dp, cp0, cp1)` after collate adds the batch dimension.
    pub placements_dp: Vec<Placement>,
    pub pad_value: PadValue,
    pub role: Role,
    pub remap: Remap,
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AxisPlan {
    /// The axis semantic, or `null` for a channel axis.
    pub semantic: Option<String>,
    /// Fixed size of a channel axis.
    pub size: Option<u64>,
    pub split: Split,
}

/// How index values change when the sample is padded and sharded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Remap {
    None,
    /// Values become positions in the padded layout of `of`. When `repad` is true the
    /// layout is owner-partitioned and a larger per-block stride at collate remaps
    /// `new = (idx // old) * new_stride + idx % old`.
    ToPaddedLayout {
        of: String,
        repad: bool,
    },
    /// Values become ids local to the shard along `mesh_axis` that holds the row.
    ShardLocal {
        of: String,
        mesh_axis: usize,
    },
    /// One-hot along co-sharded `axis`: each rank keeps its diagonal block, so column
    /// ids are local to the shard along `mesh_axis`.
    DiagonalBlock {
        of: String,
        axis: usize,
        mesh_axis: usize,
    },
}

/// Validates a spec and builds its plan; every error is returned, none is dropped.
pub fn plan(spec: &Spec) -> Result<Plan, Vec<SpecError>> {
    let mut errors = check::check(spec);
    if !errors.is_empty() {
        return Err(errors);
    }
    let workflows = spec.workflow_features();
    let workflows_of = |name: &str| -> Vec<String> {
        workflows
            .iter()
            .filter(|(_, fs)| fs.contains(name))
            .map(|(w, _)| w.clone())
            .collect()
    };

    let mut features = BTreeMap::new();
    let mut sharded_on: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    // Domain specs: the first feature (and axis) that splits each semantic, and its mesh axis.
    let mut first_split: BTreeMap<&str, (&str, usize, usize)> = BTreeMap::new();
    let mut masked_by: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, f) in &spec.features {
        let t = match &f.kind {
            FeatureKind::Metadata => {
                features.insert(
                    name.clone(),
                    FeaturePlan::Metadata {
                        workflows: workflows_of(name),
                        optional: f.optional.is_some(),
                    },
                );
                continue;
            }
            FeatureKind::Tensor(t) => t,
        };
        let inferred = match infer::infer(spec, name, t) {
            Ok(i) => i,
            Err(e) => {
                errors.push(*e);
                continue;
            }
        };
        for (i, (axis, split)) in t.axes.iter().zip(&inferred.splits).enumerate() {
            if let (Some(s), Some(m)) = (axis.semantic(), split.mesh_axis()) {
                sharded_on.entry(s).or_default().insert(m);
                if spec.mesh.domain.is_none() {
                    continue;
                }
                match first_split.get(s) {
                    Some(&(other, j, m0)) if m0 != m => errors.push(
                        SpecError::new(
                            format!(
                                "`{s}` is split over mesh axis `{}` here but over `{}` in feature `{other}` (axis {j}): their shard boundaries would not line up",
                                spec.mesh.cp[m].name, spec.mesh.cp[m0].name
                            ),
                            axis.loc,
                        )
                        .feature(name)
                        .axis(i, &axis.kind)
                        .help("order the axes alike in both features, or keep one whole with `replicate_axes`"),
                    ),
                    Some(_) => {}
                    None => {
                        first_split.insert(s, (name.as_str(), i, m));
                    }
                }
            }
        }
        if let Role::Mask { of } = &t.role {
            for s in of {
                masked_by.entry(s.as_str()).or_default().push(name.clone());
            }
        }
        let remap = remap(spec, t, &inferred.splits);
        features.insert(
            name.clone(),
            FeaturePlan::Tensor(Box::new(TensorPlan {
                dtype: t.dtype,
                axes: t
                    .axes
                    .iter()
                    .zip(&inferred.splits)
                    .map(|(a, s)| AxisPlan {
                        semantic: a.semantic().map(str::to_owned),
                        size: match a.kind {
                            AxisKind::Channel(n) => Some(n),
                            AxisKind::Semantic(_) => None,
                        },
                        split: *s,
                    })
                    .collect(),
                placements: inferred.placements.to_vec(),
                placements_dp: infer::with_dp(&inferred.placements),
                // check() proved the pad value fits the dtype.
                pad_value: t.pad.coerce(t.dtype).unwrap_or(t.pad),
                role: t.role.clone(),
                remap,
                workflows: workflows_of(name),
                optional: f.optional.is_some(),
                derived: t.derived.as_ref().map(|d| d.rule.clone()),
                parameter: t.parameter.is_some(),
                output: t.output.is_some(),
            })),
        );
    }
    if !errors.is_empty() {
        return Err(errors);
    }

    let roots = roots_of(spec);
    let semantics = spec
        .semantics
        .values()
        .map(|s| {
            let own: Vec<usize> = sharded_on
                .get(s.name.as_str())
                .map(|m| m.iter().copied().collect())
                .unwrap_or_default();
            let padding = padding(spec, s, &roots, &sharded_on);
            let plan = SemanticPlan {
                sharded: s.sharded,
                batch: s.batch,
                sharded_on: own,
                padding,
                masked_by: masked_by.remove(s.name.as_str()).unwrap_or_default(),
                window: s.window,
                incoming: s.incoming.as_ref().map(|i| i.source.clone()),
                unowned_rows_are_pads: s.unowned_rows.is_some(),
                stride: s.shards.stride.unwrap_or(1).max(1),
                halo: s.shards.halo.unwrap_or(0),
            };
            (s.name.clone(), plan)
        })
        .collect();

    Ok(Plan {
        version: PLAN_VERSION,
        module: spec.module.name.clone(),
        source: spec.source.clone(),
        mesh: MeshPlan {
            cp: spec.mesh.cp.iter().map(|n| n.name.clone()).collect(),
            dp: spec.mesh.dp.as_ref().map(|d| d.name.clone()),
            domain: spec.mesh.domain.as_ref().map(|d| DomainPlan {
                uneven: d.uneven.clone(),
            }),
        },
        semantics,
        features,
        workflows: workflows
            .into_iter()
            .map(|(w, fs)| (w, fs.into_iter().collect()))
            .collect(),
        inputs: InputsPlan {
            other_keys: spec.inputs.other_keys,
            drop: spec
                .inputs
                .drop
                .iter()
                .map(|d| d.name.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        },
    })
}

/// The root of `s`'s ownership tree, following sharded owners.
fn root_of<'a>(spec: &'a Spec, s: &'a Semantic) -> &'a Semantic {
    let mut root = s;
    // Bounded: check() has rejected cycles, and a tree is never deeper than its size.
    for _ in 0..spec.semantics.len() {
        match root
            .owner
            .as_ref()
            .and_then(|o| spec.semantics.get(&o.owner.name))
        {
            Some(o) if o.sharded => root = o,
            _ => break,
        }
    }
    root
}

/// The root of every semantic's ownership tree, each walked once.
fn roots_of(spec: &Spec) -> BTreeMap<&str, &str> {
    spec.semantics
        .values()
        .map(|s| (s.name.as_str(), root_of(spec, s).name.as_str()))
        .collect()
}

fn padding(
    spec: &Spec,
    s: &Semantic,
    roots: &BTreeMap<&str, &str>,
    sharded_on: &BTreeMap<&str, BTreeSet<usize>>,
) -> Padding {
    if !s.sharded {
        return Padding::None;
    }
    let root = root_of(spec, s);
    let members = spec
        .semantics
        .values()
        .filter(|m| m.sharded && roots.get(m.name.as_str()) == Some(&root.name.as_str()));
    let mesh_axes: Vec<usize> = members
        .filter_map(|m| sharded_on.get(m.name.as_str()))
        .flatten()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // Uneven domain axes split by chunks: nothing to pad for them.
    let mesh_axes: Vec<usize> = match &spec.mesh.domain {
        Some(d) => mesh_axes
            .into_iter()
            .filter(|&m| !d.uneven.get(m).copied().unwrap_or(false))
            .collect(),
        None => mesh_axes,
    };
    if mesh_axes.is_empty() {
        return Padding::None;
    }
    match &s.owner {
        Some(o) if !std::ptr::eq(root, s) => Padding::OwnerBlocks {
            owner: o.owner.name.clone(),
            root: root.name.clone(),
            source: o.source.clone(),
            mesh_axes,
        },
        _ => Padding::Multiple { mesh_axes },
    }
}

fn remap(spec: &Spec, t: &TensorFeature, splits: &[Split]) -> Remap {
    let Role::Index(ix) = &t.role else {
        return Remap::None;
    };
    match (ix.one_hot, ix.scope) {
        (_, IndexScope::Serial) => Remap::None,
        // Moving one-hot columns with their axis is the padded layout already.
        (Some(_), IndexScope::PaddedGlobal) => Remap::None,
        (Some(axis), IndexScope::ShardLocal) => Remap::DiagonalBlock {
            of: ix.of.clone(),
            axis,
            mesh_axis: splits.get(axis).and_then(|s| s.mesh_axis()).unwrap_or(0),
        },
        (None, IndexScope::PaddedGlobal) => Remap::ToPaddedLayout {
            of: ix.of.clone(),
            repad: spec
                .semantics
                .get(&ix.of)
                .is_some_and(|s| s.sharded && s.owner.is_some()),
        },
        (None, IndexScope::ShardLocal) => Remap::ShardLocal {
            of: ix.of.clone(),
            mesh_axis: splits.iter().find_map(|s| s.mesh_axis()).unwrap_or(0),
        },
    }
}

/// Run-time sizes of one sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lengths {
    /// Length of every semantic's axes (unpadded).
    pub sizes: BTreeMap<String, usize>,
    /// For each owner-partitioned semantic: its item count per root owner, in order.
    pub counts: BTreeMap<String, Vec<usize>>,
}

/// A plan evaluated for one mesh and one sample's lengths.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct Resolved {
    pub mesh: [usize; CP_AXES],
    /// Padded length of every semantic that was given a length.
    pub padded: BTreeMap<String, usize>,
    /// Block layout of every owner-partitioned semantic.
    pub blocks: BTreeMap<String, BlockLayout>,
    pub features: BTreeMap<String, FeatureShapes>,
}

#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct FeatureShapes {
    /// The serial shape (run-time lengths, unpadded).
    pub serial_shape: Vec<usize>,
    /// Every semantic axis at its padded length.
    pub padded_shape: Vec<usize>,
    /// The DTensor's global shape: co-sharded (diagonal-block) axes count one block.
    pub global_shape: Vec<usize>,
    /// Each rank's local block.
    pub local_shape: Vec<usize>,
    pub pad_value: PadValue,
}

/// Why a plan could not be resolved for a sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolveError {
    BadMesh {
        mesh: Vec<usize>,
    },
    MissingLength {
        semantic: String,
        feature: String,
        axis: usize,
    },
    MissingCounts {
        semantic: String,
    },
    CountsLength {
        semantic: String,
        owner: String,
        expected: usize,
        got: usize,
    },
    CountsSum {
        semantic: String,
        expected: usize,
        got: usize,
    },
    UnknownWorkflow {
        workflow: String,
    },
    OwnerOutOfRange {
        semantic: String,
        owner: String,
        index: usize,
        len: usize,
    },
    /// An uneven domain axis too short for its ranks: a shard would be empty.
    EmptyShard {
        feature: String,
        axis: usize,
        semantic: String,
        len: usize,
        ranks: usize,
    },
    /// An uneven domain axis whose shards break the semantic's stride or halo.
    ShardRule(Box<ShardBreach>),
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveError::BadMesh { mesh } => write!(f, "mesh sizes {mesh:?}: every CP mesh axis needs size at least 1, and the mesh at most {} ranks", crate::limits::MAX_RANKS),
            ResolveError::MissingLength { semantic, feature, axis } => write!(
                f,
                "feature `{feature}`, axis {axis} ({semantic}): no run-time length given for semantic `{semantic}`"
            ),
            ResolveError::MissingCounts { semantic } => write!(
                f,
                "semantic `{semantic}`: owner-partitioned, but no per-owner counts were given"
            ),
            ResolveError::CountsLength { semantic, owner, expected, got } => write!(
                f,
                "semantic `{semantic}`: {got} owner counts given, but `{owner}` has length {expected}"
            ),
            ResolveError::CountsSum { semantic, expected, got } => write!(
                f,
                "semantic `{semantic}`: owner counts sum to {got}, but its length is {expected}"
            ),
            ResolveError::UnknownWorkflow { workflow } => write!(f, "workflow `{workflow}` is not declared"),
            ResolveError::OwnerOutOfRange { semantic, owner, index, len } => write!(
                f,
                "semantic `{semantic}`: an item is owned by `{owner}` {index}, but `{owner}` has length {len}"
            ),
            ResolveError::EmptyShard { feature, axis, semantic, len, ranks } => write!(
                f,
                "feature `{feature}`, axis {axis} ({semantic}): {len} items over {ranks} ranks would leave a shard empty"
            ),
            ResolveError::ShardRule(b) => {
                let ShardBreach { feature, axis, semantic, len, ranks, mesh_axis, sizes, stride, halo } = &**b;
                write!(
                f,
                "feature `{feature}`, axis {axis} ({semantic}): {len} items over {ranks} ranks of mesh axis `{mesh_axis}` \
                 give shards {sizes:?}, but `{semantic}` needs every shard {}; no uneven layout exists: \
                 pad the axis (drop `{mesh_axis}` from `uneven`) or change the length or the mesh",
                shard_needs(*stride, *halo)
            )
            }
        }
    }
}

/// `a multiple of 2 and at least 3 long`: what a semantic's shards must be.
fn shard_needs(stride: u32, halo: u32) -> String {
    let mut needs = Vec::new();
    if stride > 1 {
        needs.push(format!("a multiple of {stride}"));
    }
    if halo > 0 {
        needs.push(format!("at least {halo} long"));
    }
    needs.join(" and ")
}

/// The `torch.chunk` pieces of an uneven axis that break its semantic's stride or halo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardBreach {
    pub feature: String,
    pub axis: usize,
    pub semantic: String,
    pub len: usize,
    pub ranks: usize,
    pub mesh_axis: String,
    pub sizes: Vec<usize>,
    pub stride: u32,
    pub halo: u32,
}

impl std::error::Error for ResolveError {}

impl Plan {
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

    /// The padding multiple of a semantic on this mesh (1 when never padded): the lcm
    /// of the sizes of the mesh axes that split it, times its stride.
    pub fn pad_multiple(&self, semantic: &str, mesh: [usize; CP_AXES]) -> usize {
        let Some(s) = self.semantics.get(semantic) else {
            return 1;
        };
        match &s.padding {
            Padding::Multiple { mesh_axes } => {
                lcm_of(mesh_axes.iter().map(|&m| mesh[m])) * s.stride.max(1) as usize
            }
            Padding::OwnerBlocks { mesh_axes, .. } => lcm_of(mesh_axes.iter().map(|&m| mesh[m])),
            Padding::None => 1,
        }
    }

    /// The `torch.chunk` pieces of an uneven axis must meet its semantic's stride and
    /// halo: nothing can be padded to make them.
    fn check_shard_rule(
        &self,
        feature: &str,
        axis: usize,
        semantic: Option<&str>,
        mesh_axis: usize,
        sizes: &[usize],
    ) -> Result<(), ResolveError> {
        let Some((name, s)) = semantic.and_then(|n| Some((n, self.semantics.get(n)?))) else {
            return Ok(());
        };
        if s.admits_shards(sizes) {
            return Ok(());
        }
        Err(ResolveError::ShardRule(Box::new(ShardBreach {
            feature: feature.to_owned(),
            axis,
            semantic: name.to_owned(),
            len: sizes.iter().sum(),
            ranks: sizes.len(),
            mesh_axis: self.mesh.cp.get(mesh_axis).cloned().unwrap_or_default(),
            sizes: sizes.to_vec(),
            stride: s.stride,
            halo: s.halo,
        })))
    }

    /// The padded length of a semantic's axes for `len` items: a multiple of
    /// [`Plan::pad_multiple`], and long enough that every shard holds its halo.
    pub fn padded_length(&self, semantic: &str, len: usize, mesh: [usize; CP_AXES]) -> usize {
        let halo_min = match self.semantics.get(semantic) {
            Some(SemanticPlan {
                padding: Padding::Multiple { mesh_axes },
                halo,
                ..
            }) => {
                let most = mesh_axes.iter().map(|&m| mesh[m]).max().unwrap_or(1);
                *halo as usize * most
            }
            _ => 0,
        };
        round_up(len.max(halo_min), self.pad_multiple(semantic, mesh))
    }

    /// Evaluates the plan for a mesh and one sample's lengths, for the features of
    /// `workflow` (all features for `None`). Owner counts are per root owner.
    pub fn resolve(
        &self,
        mesh: [usize; CP_AXES],
        lengths: &Lengths,
        workflow: Option<&str>,
    ) -> Result<Resolved, ResolveError> {
        let mut roots = BTreeMap::new();
        for (name, s) in &self.semantics {
            let Padding::OwnerBlocks { root, .. } = &s.padding else {
                continue;
            };
            let Some(&len) = lengths.sizes.get(name) else {
                continue;
            };
            let counts = lengths
                .counts
                .get(name)
                .ok_or_else(|| ResolveError::MissingCounts {
                    semantic: name.clone(),
                })?;
            let root_len =
                lengths
                    .sizes
                    .get(root)
                    .copied()
                    .ok_or_else(|| ResolveError::MissingLength {
                        semantic: root.clone(),
                        feature: format!("(owner of {name})"),
                        axis: 0,
                    })?;
            if counts.len() != root_len {
                return Err(ResolveError::CountsLength {
                    semantic: name.clone(),
                    owner: root.clone(),
                    expected: root_len,
                    got: counts.len(),
                });
            }
            let sum: usize = counts.iter().sum();
            if sum != len {
                return Err(ResolveError::CountsSum {
                    semantic: name.clone(),
                    expected: len,
                    got: sum,
                });
            }
            let of_items: Vec<usize> = counts
                .iter()
                .enumerate()
                .flat_map(|(owner, &c)| std::iter::repeat_n(owner, c))
                .collect();
            roots.insert(name.clone(), of_items);
        }
        let layout = self.layout_from_roots(mesh, &lengths.sizes, roots)?;
        let features = self.shapes(&layout, workflow)?;
        Ok(Resolved {
            mesh,
            padded: layout.padded,
            blocks: layout.blocks,
            features,
        })
    }

    /// The padded layout of one sample: its lengths and, for every owner-partitioned
    /// semantic, who owns each item (as the spec's owner source gives it).
    pub fn layout(
        &self,
        mesh: [usize; CP_AXES],
        sizes: &BTreeMap<String, usize>,
        owners: &BTreeMap<String, Ownership>,
    ) -> Result<SampleLayout, ResolveError> {
        // Chain each owned semantic to its root: owners before what they own.
        let mut roots: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for name in self.semantic_order() {
            let Some(SemanticPlan {
                padding: Padding::OwnerBlocks { owner, .. },
                ..
            }) = self.semantics.get(name)
            else {
                continue;
            };
            let Some(&len) = sizes.get(name) else {
                continue;
            };
            let owner_len = *sizes
                .get(owner)
                .ok_or_else(|| ResolveError::MissingLength {
                    semantic: owner.clone(),
                    feature: format!("(owner of {name})"),
                    axis: 0,
                })?;
            let direct: Vec<usize> = match owners.get(name) {
                None => {
                    return Err(ResolveError::MissingCounts {
                        semantic: name.to_owned(),
                    })
                }
                Some(Ownership::Counts(counts)) => {
                    if counts.len() != owner_len {
                        return Err(ResolveError::CountsLength {
                            semantic: name.to_owned(),
                            owner: owner.clone(),
                            expected: owner_len,
                            got: counts.len(),
                        });
                    }
                    let sum: usize = counts.iter().sum();
                    if sum != len {
                        return Err(ResolveError::CountsSum {
                            semantic: name.to_owned(),
                            expected: len,
                            got: sum,
                        });
                    }
                    counts
                        .iter()
                        .enumerate()
                        .flat_map(|(o, &c)| std::iter::repeat_n(o, c))
                        .collect()
                }
                Some(Ownership::Owners(of_items)) => {
                    if of_items.len() != len {
                        return Err(ResolveError::CountsSum {
                            semantic: name.to_owned(),
                            expected: len,
                            got: of_items.len(),
                        });
                    }
                    if let Some(&bad) = of_items.iter().find(|&&o| o >= owner_len) {
                        return Err(ResolveError::OwnerOutOfRange {
                            semantic: name.to_owned(),
                            owner: owner.clone(),
                            index: bad,
                            len: owner_len,
                        });
                    }
                    of_items.clone()
                }
            };
            let root_of_items = match roots.get(owner.as_str()) {
                Some(owner_roots) => direct.iter().map(|&o| owner_roots[o]).collect(),
                None => direct,
            };
            roots.insert(name.to_owned(), root_of_items);
        }
        self.layout_from_roots(mesh, sizes, roots)
    }

    fn layout_from_roots(
        &self,
        mesh: [usize; CP_AXES],
        sizes: &BTreeMap<String, usize>,
        roots: BTreeMap<String, Vec<usize>>,
    ) -> Result<SampleLayout, ResolveError> {
        if crate::limits::check_mesh(&mesh).is_err() {
            return Err(ResolveError::BadMesh {
                mesh: mesh.to_vec(),
            });
        }
        let mut layout = SampleLayout {
            mesh,
            sizes: sizes.clone(),
            padded: BTreeMap::new(),
            positions: BTreeMap::new(),
            blocks: BTreeMap::new(),
        };
        for (name, s) in &self.semantics {
            let Some(&len) = sizes.get(name) else {
                continue;
            };
            if !matches!(s.padding, Padding::OwnerBlocks { .. }) {
                layout
                    .padded
                    .insert(name.clone(), self.padded_length(name, len, mesh));
            }
        }
        for (name, of_items) in roots {
            let Some(Padding::OwnerBlocks { root, .. }) =
                self.semantics.get(&name).map(|s| &s.padding)
            else {
                continue;
            };
            let root_padded =
                *layout
                    .padded
                    .get(root)
                    .ok_or_else(|| ResolveError::MissingLength {
                        semantic: root.clone(),
                        feature: format!("(owner of {name})"),
                        axis: 0,
                    })?;
            let blocks = self.pad_multiple(&name, mesh);
            let item_blocks: Vec<usize> = of_items
                .iter()
                .map(|&o| owner_block(o, root_padded, blocks))
                .collect();
            let l = BlockLayout::from_item_blocks(&item_blocks, blocks);
            layout
                .positions
                .insert(name.clone(), l.positions(&item_blocks));
            layout.padded.insert(name.clone(), l.padded());
            layout.blocks.insert(name, l);
        }
        Ok(layout)
    }

    /// Every feature's shapes (of `workflow`, or all) under a sample layout. Optional
    /// features whose lengths the layout lacks (absent from the sample) are left out.
    pub fn shapes(
        &self,
        layout: &SampleLayout,
        workflow: Option<&str>,
    ) -> Result<BTreeMap<String, FeatureShapes>, ResolveError> {
        let names = self.feature_names(workflow)?;
        let present = |t: &TensorPlan| {
            t.axes.iter().all(|a| {
                a.semantic
                    .as_ref()
                    .is_none_or(|s| layout.sizes.contains_key(s))
            })
        };
        let names = names.into_iter().filter(|n| match self.features.get(*n) {
            Some(FeaturePlan::Tensor(t)) => !t.optional || present(t),
            _ => false,
        });
        self.shapes_of(layout, names)
    }

    /// The shapes of the named tensor features under a sample layout.
    pub fn shapes_of<'n>(
        &self,
        layout: &SampleLayout,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Result<BTreeMap<String, FeatureShapes>, ResolveError> {
        let mesh = layout.mesh;
        let mut features = BTreeMap::new();
        for name in names {
            let Some(FeaturePlan::Tensor(t)) = self.features.get(name) else {
                continue;
            };
            let mut shapes = FeatureShapes {
                serial_shape: Vec::new(),
                padded_shape: Vec::new(),
                global_shape: Vec::new(),
                local_shape: Vec::new(),
                pad_value: t.pad_value,
            };
            for (i, a) in t.axes.iter().enumerate() {
                let (serial, full) = match (&a.semantic, a.size) {
                    (Some(s), _) => {
                        let missing = || ResolveError::MissingLength {
                            semantic: s.clone(),
                            feature: name.to_owned(),
                            axis: i,
                        };
                        let serial = *layout.sizes.get(s).ok_or_else(missing)?;
                        (serial, *layout.padded.get(s).ok_or_else(missing)?)
                    }
                    (None, Some(n)) => {
                        let n = usize::try_from(n).unwrap_or(usize::MAX);
                        (n, n)
                    }
                    (None, None) => (0, 0),
                };
                let uneven = |m: usize| {
                    self.mesh
                        .domain
                        .as_ref()
                        .is_some_and(|d| d.uneven.get(m).copied().unwrap_or(false))
                };
                let (global, local) = match a.split {
                    Split::Whole => (full, full),
                    // Uneven shards differ per rank; the largest (the first) is shown.
                    Split::Mesh { mesh_axis } if uneven(mesh_axis) => {
                        let ranks = mesh[mesh_axis];
                        let sizes = DomainPlan::chunk_sizes(full, ranks).ok_or_else(|| {
                            ResolveError::EmptyShard {
                                feature: name.to_owned(),
                                axis: i,
                                semantic: a.semantic.clone().unwrap_or_default(),
                                len: full,
                                ranks,
                            }
                        })?;
                        self.check_shard_rule(name, i, a.semantic.as_deref(), mesh_axis, &sizes)?;
                        (full, sizes[0])
                    }
                    Split::Mesh { mesh_axis } => (full, full / mesh[mesh_axis]),
                    Split::Follows { mesh_axis, .. } => {
                        let block = full / mesh[mesh_axis];
                        (block, block)
                    }
                };
                shapes.serial_shape.push(serial);
                shapes.padded_shape.push(full);
                shapes.global_shape.push(global);
                shapes.local_shape.push(local);
            }
            features.insert(name.to_owned(), shapes);
        }
        Ok(features)
    }
}

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
    pub mesh: [usize; CP_AXES],
    /// Serial length of every semantic present.
    pub sizes: BTreeMap<String, usize>,
    /// Padded length of every semantic present.
    pub padded: BTreeMap<String, usize>,
    /// Owner-partitioned semantics: the padded position of every item, in serial order.
    pub positions: BTreeMap<String, Vec<usize>>,
    pub blocks: BTreeMap<String, BlockLayout>,
}

/// The JSON Schema (draft-07) of plan.json.
pub fn json_schema() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft07().into_generator();
    let schema = generator.into_root_schema_for::<Plan>();
    serde_json::to_value(schema).unwrap_or(serde_json::Value::Null)
}

impl Plan {
    /// Semantics with every owner before what it owns, ties in name order.
    pub fn semantic_order(&self) -> Vec<&str> {
        let depth = |name: &str| -> usize {
            let mut d = 0;
            let mut cur = name;
            while let Some(SemanticPlan {
                padding: Padding::OwnerBlocks { owner, .. },
                ..
            }) = self.semantics.get(cur)
            {
                d += 1;
                cur = owner;
                if d > self.semantics.len() {
                    break;
                }
            }
            d
        };
        let mut order: Vec<&str> = self.semantics.keys().map(String::as_str).collect();
        order.sort_by_key(|s| (depth(s), *s));
        order
    }
}
