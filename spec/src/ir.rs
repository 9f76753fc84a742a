//! The Spec IR: what a feature spec says, independent of its front end (YAML or derive).
//!
//! Every item keeps the [`Loc`] it came from so that [`crate::check`] and
//! [`crate::infer`] can point at it. Maps are `BTreeMap`s: every loop over features or
//! semantics runs in sorted key order, so output is deterministic and ranks issue
//! collectives in the same order.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::loc::Loc;

/// A parsed, not yet validated, feature spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// Display name of the source (file path or type name) and its content hash.
    pub source: Source,
    /// Name of the generated modules (`<module>.py`, `<module>.rs`, ...).
    pub module: Named,
    /// The mesh axes one sample is split over.
    pub mesh: Mesh,
    /// Every declared semantic, by name.
    pub semantics: BTreeMap<String, Semantic>,
    /// Declared workflows, each a subset of the features (see [`Feature::only`]).
    pub workflows: BTreeMap<String, Loc>,
    /// Every feature, by name.
    pub features: BTreeMap<String, Feature>,
    /// What happens to sample keys the spec does not place.
    pub inputs: Inputs,
}

/// How a sample's keys that are not features are treated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inputs {
    /// Keys that are neither features nor listed in [`Inputs::drop`].
    pub other_keys: KeyPolicy,
    /// Where `other_keys` was written.
    pub other_keys_loc: Loc,
    /// Keys the featurizer emits that the model never reads: removed from every sample.
    pub drop: Vec<Named>,
    /// How a sample file's keys join a nested feature's path (`.` by default).
    pub separator: Named,
}

/// What happens to a sample key the spec does not declare.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyPolicy {
    /// An error that lists every such key at once.
    #[default]
    Refuse,
    /// Removed from the sample.
    Drop,
    /// Carried untouched to every rank, like metadata.
    Pass,
}

impl KeyPolicy {
    /// The policy as the spec writes it.
    pub fn name(self) -> &'static str {
        match self {
            KeyPolicy::Refuse => "refuse",
            KeyPolicy::Drop => "drop",
            KeyPolicy::Pass => "pass",
        }
    }

    /// The policy a spec word names, if any.
    pub fn parse(s: &str) -> Option<KeyPolicy> {
        [KeyPolicy::Refuse, KeyPolicy::Drop, KeyPolicy::Pass]
            .into_iter()
            .find(|p| p.name() == s)
    }
}

/// A name with the location it was written at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    /// The name as written.
    pub name: String,
    /// Where it was written.
    pub loc: Loc,
}

impl Named {
    /// A name at a location.
    pub fn new(name: impl Into<String>, loc: Loc) -> Self {
        Named {
            name: name.into(),
            loc,
        }
    }
}

/// Where a spec came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Source {
    /// File name (or type name, for the derive front end).
    pub name: String,
    /// Hex SHA-256 of the source text.
    pub sha256: String,
}

/// The names of the mesh axes. Sizes are chosen at run time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    /// The axes one sample is split over, and how.
    pub split: MeshSplit,
    /// The optional data-parallel axis, prepended to the sample mesh.
    pub dp: Option<Named>,
    /// Where it was written.
    pub loc: Loc,
}

/// How one sample is split: over the two context-parallel axes `(cp0, cp1)` into
/// DTensor blocks (padded, even), or over the one or two axes of a domain-parallel mesh
/// into PhysicsNeMo ShardTensors (padded, or `torch.chunk` pieces on uneven axes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MeshSplit {
    /// The context-parallel axes, `(cp0, cp1)` or `(cp,)`: DTensor blocks, padded, even.
    Cp(Vec<Named>),
    /// The one or two axes of a domain-parallel mesh: ShardTensors.
    Domain {
        /// The axes, in order.
        axes: Vec<Named>,
        /// Per axis: shards may be uneven (torch.chunk sizes) instead of padded.
        uneven: Vec<bool>,
    },
}

impl Mesh {
    /// The mesh axes that split a sample, in order; plan indices refer to this order.
    pub fn axes(&self) -> &[Named] {
        match &self.split {
            MeshSplit::Cp(axes) => axes,
            MeshSplit::Domain { axes, .. } => axes,
        }
    }

    /// Whether this is a domain-parallel (ShardTensor) mesh.
    pub fn is_domain(&self) -> bool {
        matches!(self.split, MeshSplit::Domain { .. })
    }

    /// Whether mesh axis `m` splits into uneven chunks (only a domain axis can).
    pub fn uneven(&self, m: usize) -> bool {
        match &self.split {
            MeshSplit::Cp(_) => false,
            MeshSplit::Domain { uneven, .. } => uneven.get(m).copied().unwrap_or(false),
        }
    }

    /// Whether this is a one-axis CP mesh `(cp,)`.
    pub fn is_cp_1d(&self) -> bool {
        matches!(&self.split, MeshSplit::Cp(axes) if axes.len() == 1)
    }
}

/// What an axis counts, declared once for the whole spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Semantic {
    /// The semantic's name.
    pub name: String,
    /// Whether axes of this semantic may be split over a CP mesh axis.
    pub sharded: bool,
    /// For owner-partitioned semantics: who owns each item and how that is known.
    pub owner: Option<Owner>,
    /// Atom window `W` for windowed attention packing (the runtime pads packed axes
    /// to a multiple of `W x cp0`).
    pub window: Option<u32>,
    /// The per-domain-group batch axis (domain-parallel specs): never sharded, length 1.
    pub batch: bool,
    /// Axes of this semantic may arrive padded at the end; this says which items are real.
    pub incoming: Option<Incoming>,
    /// Rows of the owner map with no owner are pads (dropped), not an error.
    pub unowned_rows: Option<Loc>,
    /// On a one-axis CP mesh, axes of this semantic stay whole (`on_1d: whole`).
    pub whole_on_1d: bool,
    /// `layout: windows`: items in serial order on every mesh, each rank's block a whole
    /// number of windows; where it was written.
    pub windows: Option<Loc>,
    /// Shard constraints of a domain-parallel spec (stencils, downsampling).
    pub shards: ShardRule,
    /// Where it was written.
    pub loc: Loc,
}

/// What every shard of a semantic's axes must satisfy: a multiple of `stride` long
/// (a downsampling stride), at least `halo` long (a stencil's halo). Padded axes are
/// padded until they do; uneven axes are refused when they do not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardRule {
    /// Every shard is a multiple of this long (a downsampling stride).
    pub stride: Option<u32>,
    /// Every shard is at least this long (a stencil's halo).
    pub halo: Option<u32>,
    /// Where the first of them was declared.
    pub loc: Loc,
}

/// How a sample tells the real items of a semantic whose axes arrive padded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// How the real items are told apart from the pads.
    pub source: IncomingSource,
    /// The value an owner id vector holds at the incoming pads (`map_pad`), and where
    /// it was written.
    pub map_pad: Option<(i64, Loc)>,
    /// Where it was written.
    pub loc: Loc,
}

/// How a sample tells the real items of a semantic that arrives padded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum IncomingSource {
    /// A 1-D mask over the semantic: 1 at the real items (a prefix), 0 at the pads.
    Mask {
        /// The mask feature.
        feature: String,
    },
    /// The semantic's owner counts: they sum to the number of real items.
    Counts {
        /// The counts feature.
        feature: String,
    },
}

impl IncomingSource {
    /// The feature that tells the real items.
    pub fn feature(&self) -> &str {
        match self {
            IncomingSource::Mask { feature } | IncomingSource::Counts { feature } => feature,
        }
    }
}

/// An owner relation: items of this semantic belong to items of `owner`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The owning semantic (e.g. `tokens` for atoms, `atoms` for R-set rows).
    pub owner: Named,
    /// How the relation is given by the sample.
    pub source: OwnerSource,
    /// Where the `counts` / `map` feature is named.
    pub source_loc: Loc,
}

/// How a sample gives each item's owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OwnerSource {
    /// A `[owner]` integer feature: how many items each owner holds, in order.
    Counts {
        /// The counts feature.
        feature: String,
    },
    /// The owner of each item: a one-hot `[items, owner]` feature, or an id vector (an
    /// integer `[items]` index of the owner).
    Map {
        /// The map feature.
        feature: String,
    },
    /// The counts when the sample has them (checked against the map), else the map.
    CountsOrMap {
        /// The counts feature.
        counts: String,
        /// The map feature (one-hot or an id vector).
        map: String,
    },
}

impl OwnerSource {
    /// The feature every sample must hold (the map when counts may be absent).
    pub fn feature(&self) -> &str {
        match self {
            OwnerSource::Counts { feature } | OwnerSource::Map { feature } => feature,
            OwnerSource::CountsOrMap { map, .. } => map,
        }
    }

    /// The counts feature, if any.
    pub fn counts(&self) -> Option<&str> {
        match self {
            OwnerSource::Counts { feature } => Some(feature),
            OwnerSource::CountsOrMap { counts, .. } => Some(counts),
            OwnerSource::Map { .. } => None,
        }
    }

    /// The map feature (one-hot or an id vector), if any.
    pub fn map(&self) -> Option<&str> {
        match self {
            OwnerSource::Map { feature } => Some(feature),
            OwnerSource::CountsOrMap { map, .. } => Some(map),
            OwnerSource::Counts { .. } => None,
        }
    }
}

/// One model input.
#[derive(Clone, Debug, PartialEq)]
pub struct Feature {
    /// The feature's name (its key in the sample).
    pub name: String,
    /// A tensor with axes, or metadata passed through.
    pub kind: FeatureKind,
    /// Workflows this feature belongs to; `None` means every workflow (the base set).
    pub only: Option<Vec<Named>>,
    /// A sample may lack it; when present it is placed and checked.
    pub optional: Option<Loc>,
    /// The spec's `doc` text.
    pub doc: Option<String>,
    /// Where it was written.
    pub loc: Loc,
}

/// What kind of value a feature is.
#[derive(Clone, Debug, PartialEq)]
pub enum FeatureKind {
    /// A tensor with declared axes and dtype.
    Tensor(Box<TensorFeature>),
    /// Non-tensor metadata passed through untouched (record ids, paths, ...).
    Metadata,
}

/// A tensor feature as declared.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorFeature {
    /// Its axes, in order.
    pub axes: Vec<Axis>,
    /// Where `axes` was written.
    pub axes_loc: Loc,
    /// Its element type.
    pub dtype: DType,
    /// Where `dtype` was written.
    pub dtype_loc: Loc,
    /// The value at pad positions.
    pub pad: PadValue,
    /// Where `pad` was written.
    pub pad_loc: Loc,
    /// Plain data, a mask or an index.
    pub role: Role,
    /// Where `role` was written.
    pub role_loc: Loc,
    /// A channel axis holding a one-hot encoding over its size's classes, and where
    /// it was written.
    pub one_hot: Option<(usize, Loc)>,
    /// Mostly zero (it travels as its nonzero entries), and where it was written.
    pub sparse: Option<Loc>,
    /// The range `[lo, hi]` every value lies in (it travels narrowed), and where it was
    /// written.
    pub range: Option<([i64; 2], Loc)>,
    /// Co-sharded axis pairs: the follower takes the leader's shard (block diagonal).
    pub coshard: Vec<CoShard>,
    /// Axes of a sharded semantic declared to stay whole (the resolution when a
    /// feature has more sharded axes than the CP mesh has axes).
    pub replicate_axes: Vec<(usize, Loc)>,
    /// Never sharded: every mesh axis `Replicate()` (padding still applies).
    pub replicated: bool,
    /// An explicit placement on the CP sub-mesh, checked against the inference.
    pub placement: Option<(Vec<Placement>, Loc)>,
    /// Computed by the pipeline from other features (when the sample lacks it).
    pub derived: Option<Derived>,
    /// A model parameter placed like the inputs (domain specs), not an input.
    pub parameter: Option<Loc>,
    /// A model output placed like the inputs (domain specs), not an input.
    pub output: Option<Loc>,
    /// The form the sample gives it in, where it is delivered in another (`deliver`).
    pub given: Option<GivenForm>,
}

/// The form a sample gives a map in, where the spec delivers it in the other: the
/// plan describes the delivered feature; intake makes it from the given one and
/// `assemble` gives the given one back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "form")]
pub enum GivenForm {
    /// An id vector `[rows]` of `dtype` (`none`, if declared, names no item), delivered
    /// as the one-hot map `[rows, items]`.
    Ids {
        /// The id vector's element type.
        dtype: DType,
        /// The value that names no item.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        none: Option<i64>,
    },
    /// A one-hot map `[rows, items]` of `dtype` (dense, or as its indices), delivered as
    /// an `int64` id vector `[rows]` with `-1` for a row with no item.
    OneHot {
        /// The one-hot map's element type.
        dtype: DType,
    },
}

impl GivenForm {
    /// The id of a row with no item once a one-hot map is delivered as ids.
    pub const NONE: i64 = -1;
}

/// A feature the pipeline makes from others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derived {
    /// How it is made.
    pub rule: DeriveRule,
    /// Where it was written.
    pub loc: Loc,
}

/// How the pipeline makes a derived feature.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DeriveRule {
    /// The outer product `a[..., None, ...] * b[None, ..., ...]`: its axes are `a`'s
    /// followed by `b`'s (`token_pair_pad_mask` from `token_pad_mask` twice).
    Outer {
        /// The two features (one twice for a feature with itself).
        of: [String; 2],
    },
    /// A validity mask: 1 on every real item of the semantics it masks (its axes), 0 on
    /// their pads; made from the sample's lengths alone.
    Valid,
    /// The key halo of feature `of` over its windowed first axis (`layout: windows`):
    /// beside each rank's block of `of`, the `size` items before the block and the
    /// `size` after it (pads past either end), `2 x size` rows a rank (AlphaFold3's 128
    /// keys around 32 queries: 48 a side). Made as blocks are laid out.
    Halo {
        /// The feature whose neighbouring rows it holds.
        of: String,
        /// Items on each side of a block.
        size: usize,
    },
}

impl DeriveRule {
    /// The features this one is made from.
    pub fn inputs(&self) -> Vec<&str> {
        match self {
            DeriveRule::Outer { of } => of.iter().map(String::as_str).collect(),
            DeriveRule::Halo { of, .. } => vec![of.as_str()],
            DeriveRule::Valid => Vec::new(),
        }
    }

    /// The halo's size (items a side), for a key halo.
    pub fn halo(&self) -> Option<usize> {
        match self {
            DeriveRule::Halo { size, .. } => Some(*size),
            _ => None,
        }
    }
}

/// One axis of a tensor feature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Axis {
    /// What the axis counts.
    pub kind: AxisKind,
    /// Where it was written.
    pub loc: Loc,
}

/// What an axis counts: items of a semantic, or a fixed number of channels.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AxisKind {
    /// An axis that counts items of a declared semantic.
    Semantic(String),
    /// A channel axis of fixed size (no semantic, never sharded, never padded).
    Channel(u64),
}

/// A co-sharded axis: it takes the shard of another axis of the same feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoShard {
    /// The follower axis.
    pub axis: usize,
    /// The leader axis whose shard the follower takes.
    pub follows: usize,
    /// Where it was written.
    pub loc: Loc,
}

/// Element types, named as in `torch`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// `torch.bool`.
    Bool,
    /// `torch.uint8`.
    Uint8,
    /// `torch.int8`.
    Int8,
    /// `torch.int16`.
    Int16,
    /// `torch.int32`.
    Int32,
    /// `torch.int64`.
    Int64,
    /// `torch.float16`.
    Float16,
    /// `torch.bfloat16`.
    Bfloat16,
    /// `torch.float32`.
    Float32,
    /// `torch.float64`.
    Float64,
}

impl DType {
    /// Every dtype, in the order errors list them.
    pub const ALL: [DType; 10] = [
        DType::Bool,
        DType::Uint8,
        DType::Int8,
        DType::Int16,
        DType::Int32,
        DType::Int64,
        DType::Float16,
        DType::Bfloat16,
        DType::Float32,
        DType::Float64,
    ];

    /// The dtype as torch names it.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::Uint8 => "uint8",
            DType::Int8 => "int8",
            DType::Int16 => "int16",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::Float16 => "float16",
            DType::Bfloat16 => "bfloat16",
            DType::Float32 => "float32",
            DType::Float64 => "float64",
        }
    }

    /// The dtype a torch name names, if any.
    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Whether values are integers (bool excluded).
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            DType::Uint8 | DType::Int8 | DType::Int16 | DType::Int32 | DType::Int64
        )
    }

    /// Whether values are floating point.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::Float16 | DType::Bfloat16 | DType::Float32 | DType::Float64
        )
    }

    /// The largest finite value of a float dtype.
    pub fn float_max(self) -> Option<f64> {
        Some(match self {
            DType::Float16 => 65504.0,
            DType::Bfloat16 => 3.389_531_389_251_535_5e38,
            DType::Float32 => f64::from(f32::MAX),
            DType::Float64 => f64::MAX,
            _ => return None,
        })
    }

    /// The inclusive integer range this dtype holds, for integer dtypes.
    pub fn int_range(self) -> Option<(i64, i64)> {
        Some(match self {
            DType::Uint8 => (0, 255),
            DType::Int8 => (-128, 127),
            DType::Int16 => (i16::MIN.into(), i16::MAX.into()),
            DType::Int32 => (i32::MIN.into(), i32::MAX.into()),
            DType::Int64 => (i64::MIN, i64::MAX),
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The value written at pad positions.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum PadValue {
    /// For bool features.
    Bool(bool),
    /// For integer features.
    Int(i64),
    /// For floating-point features.
    Float(f64),
}

impl Default for PadValue {
    fn default() -> Self {
        PadValue::Int(0)
    }
}

impl PadValue {
    /// Whether this value is zero (false, 0 or 0.0).
    pub fn is_zero(self) -> bool {
        match self {
            PadValue::Bool(b) => !b,
            PadValue::Int(i) => i == 0,
            PadValue::Float(x) => x == 0.0,
        }
    }

    /// This value written as the given dtype, or `None` when it does not fit: an
    /// integer outside the dtype's range, or a finite float beyond its largest value
    /// (infinities fit every float dtype).
    pub fn coerce(self, dtype: DType) -> Option<PadValue> {
        match (self, dtype) {
            (PadValue::Bool(b), DType::Bool) => Some(PadValue::Bool(b)),
            (PadValue::Int(i), DType::Bool) if i == 0 || i == 1 => Some(PadValue::Bool(i == 1)),
            (PadValue::Int(i), d) if d.is_integer() => {
                let (lo, hi) = d.int_range()?;
                (lo..=hi).contains(&i).then_some(PadValue::Int(i))
            }
            (PadValue::Int(i), d) if d.is_float() => PadValue::Float(i as f64).coerce(d),
            (PadValue::Float(x), d) if d.is_float() => {
                let fits = !x.is_finite() || x.abs() <= d.float_max().unwrap_or(f64::MAX);
                fits.then_some(PadValue::Float(x))
            }
            (PadValue::Float(x), d) if d.is_integer() && x.fract() == 0.0 && x.is_finite() => {
                let (lo, hi) = d.int_range()?;
                // `hi as f64 + 1.0` is the first value past the range, exactly (2^63 for
                // int64), so that no float saturates into range when cast.
                (x >= lo as f64 && x < hi as f64 + 1.0).then_some(PadValue::Int(x as i64))
            }
            _ => None,
        }
    }
}

impl fmt::Display for PadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PadValue::Bool(b) => write!(f, "{b}"),
            PadValue::Int(i) => write!(f, "{i}"),
            PadValue::Float(x) => write!(f, "{x:?}"),
        }
    }
}

/// What a feature's values mean.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Role {
    /// Plain values.
    Data,
    /// A validity mask (1 = valid) over the listed semantics: zero at their pads.
    Mask {
        /// The semantics it masks.
        of: Vec<String>,
    },
    /// Index-valued: values (or a one-hot axis) point at items of `of`.
    Index(IndexRole),
}

/// What an index-valued feature points at, and in which numbering.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IndexRole {
    /// The semantic whose items are indexed.
    pub of: String,
    /// Which numbering the values use once sharded.
    pub scope: IndexScope,
    /// `None`: the values are indices. `Some(axis)`: a one-hot encoding along that axis.
    pub one_hot: Option<usize>,
    /// The value that names no item (negative), kept as it is through every remap and
    /// pad; any other value outside the items is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub none: Option<i64>,
}

/// Which numbering an index value uses once sharded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IndexScope {
    /// Serial values, kept as they are (e.g. `token_index`).
    Serial,
    /// Ids local to the holding shard (e.g. `atom_to_token` columns).
    ShardLocal,
    /// Global positions in the padded layout (e.g. `frames_idx`).
    PaddedGlobal,
}

impl IndexScope {
    /// The scope as the spec writes it.
    pub fn name(self) -> &'static str {
        match self {
            IndexScope::Serial => "serial",
            IndexScope::ShardLocal => "shard_local",
            IndexScope::PaddedGlobal => "padded_global",
        }
    }
}

/// A DTensor placement on one mesh axis.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// The tensor dimension split over this mesh axis.
    Shard(usize),
    /// The whole tensor on every rank of this mesh axis.
    Replicate,
}

impl Placement {
    /// Parses `Shard(d)` or `Replicate()` (also `S(d)` / `R`).
    pub fn parse(s: &str) -> Option<Placement> {
        let s = s.trim();
        if matches!(s, "Replicate()" | "Replicate" | "R") {
            return Some(Placement::Replicate);
        }
        let inner = s
            .strip_prefix("Shard(")
            .or_else(|| s.strip_prefix("S("))?
            .strip_suffix(')')?;
        inner.trim().parse().ok().map(Placement::Shard)
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Shard(d) => write!(f, "Shard({d})"),
            Placement::Replicate => f.write_str("Replicate()"),
        }
    }
}

impl Spec {
    /// Features in sorted order together with their tensor description, skipping metadata.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &Feature, &TensorFeature)> {
        self.features.iter().filter_map(|(n, f)| match &f.kind {
            FeatureKind::Tensor(t) => Some((n.as_str(), f, t.as_ref())),
            FeatureKind::Metadata => None,
        })
    }

    /// The spec of one workflow: only its features, all in the base set, and that
    /// workflow alone. `None` if the workflow is not declared.
    pub fn for_workflow(&self, workflow: &str) -> Option<Spec> {
        let loc = *self.workflows.get(workflow)?;
        let names = self.workflow_features().remove(workflow)?;
        let mut spec = self.clone();
        spec.workflows = [(workflow.to_owned(), loc)].into();
        spec.features.retain(|n, _| names.contains(n));
        for f in spec.features.values_mut() {
            f.only = None;
        }
        Some(spec)
    }

    /// The feature names of each workflow (base set plus the features limited to it).
    pub fn workflow_features(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.workflows
            .keys()
            .map(|w| {
                let names = self
                    .features
                    .values()
                    .filter(|f| match &f.only {
                        None => true,
                        Some(ws) => ws.iter().any(|n| &n.name == w),
                    })
                    .map(|f| f.name.clone())
                    .collect();
                (w.clone(), names)
            })
            .collect()
    }
}

impl Axis {
    /// The semantic this axis counts; `None` for a channel axis.
    pub fn semantic(&self) -> Option<&str> {
        match &self.kind {
            AxisKind::Semantic(s) => Some(s),
            AxisKind::Channel(_) => None,
        }
    }
}

impl fmt::Display for AxisKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AxisKind::Semantic(s) => f.write_str(s),
            AxisKind::Channel(n) => write!(f, "{n}"),
        }
    }
}
