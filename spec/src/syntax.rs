//! The YAML surface syntax: serde types that keep the location of every value.
//!
//! These types are the spec file as written; [`crate::lower`] turns them into the
//! [`crate::ir`] Spec IR. Their JSON Schema ([`json_schema`]) is what editors use to
//! complete and check spec files. The derive macro builds the same tree from its
//! attributes, so both front ends go through one lowering and one set of checks.

use std::fmt;
use std::marker::PhantomData;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::loc::Loc;

/// A value with where it was written: a YAML position, or a derive attribute's token.
#[derive(Debug, Clone, PartialEq)]
pub struct Spanned<T> {
    /// The value as written.
    pub value: T,
    /// Where it was written.
    pub loc: Loc,
}

impl<T> Spanned<T> {
    /// A value at a location.
    pub fn new(value: T, loc: Loc) -> Self {
        Spanned { value, loc }
    }
}

// Serialized as its value, so the schema shows the defaults of optional keys.
impl<T: serde::Serialize> serde::Serialize for Spanned<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Spanned<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = serde_saphyr::Spanned::<T>::deserialize(d)?;
        Ok(Spanned {
            loc: Loc::from_saphyr(&s.referenced),
            value: s.value,
        })
    }
}

/// A featshard spec file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "featshard spec")]
pub struct RawSpec {
    /// Spec format version; `1`.
    #[schemars(with = "u32")]
    pub version: Spanned<u32>,
    /// Name of the generated modules (a Python/Rust identifier).
    #[schemars(with = "String")]
    pub module: Spanned<String>,
    /// Mesh axis names: `cp: [cp0, cp1]`, or `domain: [...]`.
    #[schemars(with = "RawMesh")]
    pub mesh: Spanned<RawMesh>,
    /// Axis semantics, declared once: what an axis counts and whether it shards.
    pub semantics: SpannedMap<RawSemantic>,
    /// Named feature subsets, e.g. `[training, inference]`. Features without `only`
    /// belong to every workflow.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub workflows: Vec<Spanned<String>>,
    /// The model's input features, by name.
    #[serde(default)]
    pub features: Option<SpannedMap<RawFeature>>,
    /// Sample keys that are neither features nor dropped: `refuse` (the default: an
    /// error listing them all), `drop`, or `pass` (carried untouched to every rank).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub other_keys: Option<Spanned<String>>,
    /// Keys the featurizer emits that the model never reads: removed from every sample.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub drop: Vec<Spanned<String>>,
    /// How a sample file's keys join the path of a feature in a nested dict
    /// (`constraint_feature.contact` in the spec): `.` (the default), `/`, `__`, ...
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub separator: Option<Spanned<String>>,
}

/// Mesh axis names; sizes are chosen at run time.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMesh {
    /// The context-parallel mesh axes, in order: `[cp0, cp1]` (a 2-D tile) or `[cp]`
    /// (one axis of any size); DTensor, padded even shards. A spec names either `cp` or
    /// `domain`.
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>", length(min = 1, max = 2))]
    pub cp: Option<Spanned<Vec<Spanned<String>>>>,
    /// The domain-parallel mesh axes (one or two) of a PhysicsNeMo ShardTensor model.
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>", length(min = 1, max = 2))]
    pub domain: Option<Spanned<Vec<Spanned<String>>>>,
    /// Domain axes whose shards may be uneven (ShardTensor chunks); the others are
    /// padded to even shards.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub uneven: Vec<Spanned<String>>,
    /// Optional data-parallel axis name (`dp`, or `ddp`), prepended to the sample mesh.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub dp: Option<Spanned<String>>,
}

/// One axis semantic.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawSemantic {
    /// Whether axes of this semantic are split over a CP mesh axis.
    #[schemars(with = "bool")]
    pub shard: Spanned<Flag>,
    /// Owning semantic: items are partitioned by the shard of their owner.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub owner: Option<Spanned<String>>,
    /// Integer `[owner]` feature giving how many items each owner holds.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub counts: Option<Spanned<String>>,
    /// One-hot `[items, owner]` feature giving each item's owner.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub map: Option<Spanned<String>>,
    /// Window `W` of windowed attention over this axis (packing pads to `W x cp0`).
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub window: Option<Spanned<u32>>,
    /// The per-domain-group batch axis of a domain-parallel spec: never sharded, and
    /// of length 1 in every scattered input.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub batch: Option<Spanned<Flag>>,
    /// Axes of this semantic may arrive padded at the end (as a featurizer pads to a
    /// window or a maximum): how the real items are told apart.
    #[serde(default)]
    #[schemars(with = "Option<RawIncoming>")]
    pub incoming_pads: Option<Spanned<RawIncoming>>,
    /// Domain-parallel specs: every shard of an axis of this semantic is a multiple of
    /// `stride` long (a downsampling stride); padded axes are padded to make it so.
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub stride: Option<Spanned<u32>>,
    /// Domain-parallel specs: every shard of an axis of this semantic is at least
    /// `halo` long (a stencil's halo); padded axes are padded to make it so.
    #[serde(default)]
    #[schemars(with = "Option<u32>")]
    pub halo: Option<Spanned<u32>>,
    /// `pad`: rows of the owner map with no owner are pads (dropped), not an error.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub unowned_rows: Option<Spanned<String>>,
    /// On a one-axis CP mesh `(cp,)`: `whole` keeps axes of this semantic whole, so
    /// that a tensor's other sharded axis takes the mesh axis (MSA rows whole, tokens
    /// on cp); `shard` (the default) lets them take it. Ignored on a 2-D mesh.
    #[serde(default)]
    #[schemars(schema_with = "on_1d_schema")]
    pub on_1d: Option<Spanned<String>>,
    /// How an owned semantic's items lie: `owner_blocks` (the default on a 2-D tile:
    /// each token shard's atoms in a block of their own) or `windows` (serial order on
    /// every mesh, each rank's block a whole number of `window`s, for windowed
    /// attention: AlphaFold3's sequence-local atom attention).
    #[serde(default)]
    #[schemars(schema_with = "layout_schema")]
    pub layout: Option<Spanned<String>>,
    /// Free text for the spec's readers.
    #[serde(default)]
    pub doc: Option<String>,
}

/// `layout`'s values in the JSON Schema.
fn layout_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": ["string", "null"],
        "enum": ["owner_blocks", "windows", null],
    })
}

/// `on_1d`'s values in the JSON Schema (the parser reads a string and names a wrong
/// value with its line and column).
fn on_1d_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": ["string", "null"],
        "enum": ["shard", "whole", null],
    })
}

/// How the real items of a semantic that arrives padded are known.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawIncoming {
    /// A 1-D mask feature over the semantic: 1 at the real items (a prefix), 0 at pads.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub mask: Option<Spanned<String>>,
    /// `true`: the semantic's owner counts sum to the number of real items.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub counts: Option<Spanned<Flag>>,
    /// The value the owner map (an id vector) holds at the incoming pads: a featurizer
    /// that pads the map with a real id (OpenFold3's collator pads with 0) says so here.
    #[serde(default)]
    #[schemars(with = "Option<i64>")]
    pub map_pad: Option<Spanned<i64>>,
}

/// How the pipeline makes a derived feature.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawDerive {
    /// Outer product of two features (one name: of that feature with itself); the
    /// derived axes are the first's followed by the second's.
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>", length(min = 1, max = 2))]
    pub outer: Option<Spanned<Vec<Spanned<String>>>>,
    /// `true`: a validity mask the featurizer does not emit, 1 on every real item of
    /// the semantics it masks and 0 on pads (AlphaFold3-family samples carry none).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub valid: Option<Spanned<Flag>>,
    /// The key halo of a feature over its windowed first axis: each rank gets, beside
    /// its block of `of`, the `size` items before and after it (`2 x size` rows).
    #[serde(default)]
    #[schemars(with = "Option<RawHalo>")]
    pub halo: Option<Spanned<RawHalo>>,
}

/// A key halo: the feature and the items on each side of a block.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHalo {
    /// The feature whose neighbouring rows the halo holds.
    pub of: String,
    /// Items on each side of a rank's block (AlphaFold3: 48).
    #[schemars(range(min = 1))]
    pub size: u64,
}

/// One feature.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFeature {
    /// Ordered axes: a semantic name, or an integer for a fixed-size channel axis.
    #[serde(default)]
    #[schemars(with = "Option<Vec<RawAxis>>")]
    pub axes: Option<Spanned<Vec<Spanned<RawAxis>>>>,
    /// Element type, as named in torch (`float32`, `int64`, `bool`, ...).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub dtype: Option<Spanned<String>>,
    /// Value at pad positions (default 0).
    #[serde(default)]
    #[schemars(with = "Option<RawScalar>")]
    pub pad: Option<Spanned<RawScalar>>,
    /// A validity mask (1 = valid) over these semantics.
    #[serde(default)]
    #[schemars(with = "Option<OneOrMany>")]
    pub mask: Option<Spanned<OneOrMany>>,
    /// Index-valued feature.
    #[serde(default)]
    #[schemars(with = "Option<RawIndex>")]
    pub index: Option<Spanned<RawIndex>>,
    /// A channel axis holding a one-hot encoding over its size's classes: each row
    /// along it holds one 1 (or none, a pad row), so it travels and rests as indices.
    #[serde(default)]
    #[schemars(with = "Option<usize>")]
    pub one_hot: Option<Spanned<usize>>,
    /// Mostly zero: its blocks travel and rest as their nonzero entries (position and
    /// value), and grow to their dense form where they are used.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub sparse: Option<Spanned<Flag>>,
    /// The range `[lo, hi]` every value of an integer feature lies in (pads too): its
    /// blocks travel and rest in the smallest integer type holding it.
    #[serde(default)]
    #[schemars(with = "Option<[i64; 2]>")]
    pub range: Option<Spanned<Vec<Spanned<RawScalar>>>>,
    /// Co-sharded axes: `{axis: 1, follows: 0}` makes axis 1 take axis 0's shard.
    #[serde(default)]
    #[schemars(with = "Option<Vec<RawCoShard>>")]
    pub coshard: Option<Spanned<Vec<Spanned<RawCoShard>>>>,
    /// Axes of a sharded semantic kept whole (when there are more than mesh axes).
    #[serde(default)]
    #[schemars(with = "Option<Vec<usize>>")]
    pub replicate_axes: Option<Spanned<Vec<Spanned<usize>>>>,
    /// Never sharded: `Replicate()` on every mesh axis.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub replicated: Option<Spanned<Flag>>,
    /// Non-tensor metadata passed through untouched (no axes, no dtype).
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub metadata: Option<Spanned<Flag>>,
    /// Expected placement on `(cp0, cp1)`, e.g. `[Shard(0), Replicate()]`; must agree
    /// with the inferred one.
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    pub placement: Option<Spanned<Vec<Spanned<String>>>>,
    /// Workflows this feature belongs to (default: all).
    #[serde(default)]
    #[schemars(with = "Option<Vec<String>>")]
    pub only: Option<Spanned<Vec<Spanned<String>>>>,
    /// A sample may lack this feature; when present it is placed and checked.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub optional: Option<Spanned<Flag>>,
    /// A model parameter of a domain-parallel spec (a positional embedding, a RoPE
    /// table), placed by the same inference as the inputs: FSDP2 shards it over the
    /// domain mesh. Not an input.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub parameter: Option<Spanned<Flag>>,
    /// A model output of a domain-parallel spec (a prediction), placed by the same
    /// inference: `gather_outputs` cuts its padded axes back to the sample's lengths.
    /// Not an input.
    #[serde(default)]
    #[schemars(with = "Option<bool>")]
    pub output: Option<Spanned<Flag>>,
    /// Made by the pipeline from other features when the sample lacks it (and checked
    /// against them when it has it).
    #[serde(default)]
    #[schemars(with = "Option<RawDerive>")]
    pub derive: Option<Spanned<RawDerive>>,
    /// Free text for the spec's readers.
    #[serde(default)]
    pub doc: Option<String>,
}

// The untagged enums end with an `Invalid` catch-all, so that a value of the wrong kind
// reaches lowering, which names the feature and axis, instead of failing the whole parse
// with serde's "data did not match any variant". The schema lists the valid kinds only.

/// An axis entry: a semantic name or a channel size.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawAxis {
    /// A channel axis of this size.
    Size(u64),
    /// An axis of this semantic.
    Name(String),
    /// Anything else: lowering names it in its error.
    #[schemars(skip)]
    Invalid(serde_json::Value),
}

/// A pad value.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawScalar {
    /// A bool pad.
    Bool(bool),
    /// An integer pad.
    Int(i64),
    /// A float pad.
    Float(f64),
    /// Anything else: lowering names it in its error.
    #[schemars(skip)]
    Invalid(serde_json::Value),
}

/// One name or a list of names.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One name.
    One(String),
    /// A list of names.
    Many(Vec<String>),
    /// Anything else: lowering names it in its error.
    #[schemars(skip)]
    Invalid(serde_json::Value),
}

impl OneOrMany {
    /// The names, or the value that is neither a name nor a list of names.
    pub fn into_vec(self) -> Result<Vec<String>, serde_json::Value> {
        match self {
            OneOrMany::One(s) => Ok(vec![s]),
            OneOrMany::Many(v) => Ok(v),
            OneOrMany::Invalid(v) => Err(v),
        }
    }
}

/// An index-valued feature: what it points at and how.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawIndex {
    /// The semantic whose items the values point at.
    pub of: String,
    /// `serial`, `shard_local` or `padded_global`.
    pub scope: String,
    /// One-hot encoding along this axis, instead of index values.
    #[serde(default)]
    pub one_hot: Option<usize>,
    /// The value that names no item (AlphaFold3's `-1`: an ion has no frame atom): a
    /// negative integer, kept as it is through every remap and pad.
    #[serde(default)]
    pub none: Option<i64>,
    /// The form the model and the rank files get a map in: `ids` (a one-hot map
    /// delivered as an id vector, -1 for none) or `one_hot` (an id vector delivered as a
    /// one-hot map); by default the form it is declared in, which `assemble` gives back.
    #[serde(default)]
    #[schemars(with = "Option<DeliverForm>")]
    pub deliver: Option<String>,
}

/// The form a map is delivered in. Read from its name by lowering (`parse`), so that a
/// wrong one is told at its line; the schema lists the names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliverForm {
    /// An id vector: each row's item id, -1 for none.
    Ids,
    /// A one-hot map `[rows, items]`.
    OneHot,
}

impl DeliverForm {
    /// Every form, as the spec names it.
    pub const ALL: [DeliverForm; 2] = [DeliverForm::Ids, DeliverForm::OneHot];

    /// The spec's name of the form.
    pub fn name(self) -> &'static str {
        match self {
            DeliverForm::Ids => "ids",
            DeliverForm::OneHot => "one_hot",
        }
    }

    /// The form a spec names, if any.
    pub fn parse(name: &str) -> Option<DeliverForm> {
        DeliverForm::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// A co-sharded axis pair.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCoShard {
    /// The follower axis.
    pub axis: usize,
    /// The leader axis whose shard the follower takes.
    pub follows: usize,
}

/// A YAML boolean, `true` or `false` as written: a quoted `"yes"` or `"true"` is a
/// string, not a flag (YAML 1.1's `yes`/`on` are not booleans either).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag(pub bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FlagVisitor;
        impl Visitor<'_> for FlagVisitor {
            type Value = Flag;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`true` or `false` (unquoted)")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Flag, E> {
                Ok(Flag(b))
            }
        }
        d.deserialize_any(FlagVisitor)
    }
}

impl JsonSchema for Flag {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Flag".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        bool::json_schema(generator)
    }
}

/// A YAML mapping kept in source order, each key with its location.
#[derive(Debug)]
pub struct SpannedMap<V>(pub Vec<(Spanned<String>, Option<V>)>);

impl<V> Default for SpannedMap<V> {
    fn default() -> Self {
        SpannedMap(Vec::new())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for SpannedMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MapVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for MapVisitor<V> {
            type Value = SpannedMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping of names")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    // `name:` with no body is kept as `None`; lowering reports what it lacks.
                    out.push((key, map.next_value::<Option<V>>()?));
                }
                Ok(SpannedMap(out))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(SpannedMap(Vec::new()))
            }
        }
        d.deserialize_map(MapVisitor(PhantomData))
    }
}

impl<V: JsonSchema> JsonSchema for SpannedMap<V> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        format!("Map_of_{}", V::schema_name()).into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let value = generator.subschema_for::<V>();
        // A feature may be named by its path in a nested dict (`constraint_feature.contact`).
        let pattern = match V::schema_name() == RawFeature::schema_name() {
            true => "^[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)*$",
            false => "^[a-z][a-z0-9_]*$",
        };
        schemars::json_schema!({
            "type": "object",
            "propertyNames": { "pattern": pattern },
            "additionalProperties": value,
        })
    }
}

/// The JSON Schema (draft-07) of spec files.
pub fn json_schema() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft07().into_generator();
    let schema = generator.into_root_schema_for::<RawSpec>();
    serde_json::to_value(schema).unwrap_or(serde_json::Value::Null)
}
