//! The Plan IR: the rules every front end and runtime executes.
//!
//! A plan holds no sample sizes. Given the mesh sizes, the run-time lengths and, for
//! owner-partitioned semantics, the owner counts, [`Plan::resolve`] yields every
//! feature's padded shape, DTensor global shape, per-rank local shape and pad value.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::infer::Split;
use crate::ir::*;
use crate::layout::BlockLayout;
use crate::ownership::chain;

mod build;
mod error;
mod feature;
pub mod integrity;
mod mesh;
mod resolve;
mod sample;
mod semantic;
mod shapes;
mod symbolic;

pub use build::plan;
pub use error::{ResolveError, ShardBreach};
pub use feature::*;
pub use mesh::*;
pub use resolve::{Lengths, RootCounts};
pub use sample::{Ownership, SampleLayout};
pub use semantic::*;
pub use shapes::{FeatureShapes, Resolved};
pub use symbolic::{spread_evenly, Extent, SymbolicShapes};

/// One whole axis re-laid out by DP collate ([`Plan::collate_spreads`]): its blocks of
/// `old` items each become blocks of `new` items, the items first and pads after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spread {
    /// The tensor axis.
    pub axis: usize,
    /// The sample's block length of the semantic the axis holds.
    pub old: usize,
    /// The batch's block length.
    pub new: usize,
}

/// Shapes by name, as the plan's shape lookups take them.
fn shape_pairs(m: &BTreeMap<String, Vec<usize>>) -> Vec<(&str, &[usize])> {
    m.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect()
}

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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputsPlan {
    /// Keys that are neither features nor in `drop`: refused, dropped or passed.
    pub other_keys: KeyPolicy,
    /// Keys removed from every sample, sorted.
    pub drop: Vec<String>,
    /// How a sample file's keys join a nested feature's path (`constraint_feature.contact`
    /// is the key `constraint_feature/contact` with `/`). Absent: `.`, the spec's own.
    #[serde(default = "path_separator", skip_serializing_if = "is_path_separator")]
    pub separator: String,
}

fn path_separator() -> String {
    crate::names::PATH.to_owned()
}

fn is_path_separator(s: &String) -> bool {
    s == crate::names::PATH
}

impl Default for InputsPlan {
    fn default() -> InputsPlan {
        InputsPlan {
            other_keys: KeyPolicy::default(),
            drop: Vec::new(),
            separator: path_separator(),
        }
    }
}

impl InputsPlan {
    /// A sample file's key as the spec names it: the separator's joins made `.`.
    pub fn name_of_key<'k>(&self, key: &'k str) -> std::borrow::Cow<'k, str> {
        match self.separator.as_str() {
            crate::names::PATH => key.into(),
            sep => key.replace(sep, crate::names::PATH).into(),
        }
    }

    /// The key a sample file holds feature `name` under.
    pub fn key_of<'n>(&self, name: &'n str) -> std::borrow::Cow<'n, str> {
        match self.separator.as_str() {
            crate::names::PATH => name.into(),
            sep => name.replace(crate::names::PATH, sep).into(),
        }
    }
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
    /// `shapes` (feature name -> local shape, in name order) that has such an axis. A key
    /// halo's rows are not a block of its semantic and never answer.
    pub fn mesh_split_length<'a>(
        &self,
        semantic: &str,
        shapes: impl IntoIterator<Item = (&'a str, &'a [usize])>,
    ) -> Option<usize> {
        shapes.into_iter().find_map(|(name, shape)| {
            let t = self.tensor(name)?;
            if t.derived.as_ref().and_then(DeriveRule::halo).is_some() {
                return None;
            }
            t.axes.iter().zip(shape).find_map(|(a, &n)| {
                (a.semantic.as_deref() == Some(semantic) && matches!(a.split, Split::Mesh { .. }))
                    .then_some(n)
            })
        })
    }

    /// DP collate's re-pad of feature `name`'s values, an index into the padded layout of
    /// a sharded semantic: the block length `(old, new)` of the semantic it points into,
    /// read off the sample's local shapes and the batch's agreed ones (`None` when the
    /// feature is not re-padded or no feature splits that semantic). Collate pads every
    /// block at its end, so a position `v` of the padded layout moves to
    /// `(v / old) * new + v % old` ([`crate::layout::repad_index`]).
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

    /// DP collate's re-layout of feature `name`'s whole axes that hold a sharded
    /// semantic's padded layout (a map's global columns on one CP axis): such an axis is
    /// `k` blocks of the semantic, and each block of `old` items becomes one of `new`
    /// items in the batch, its items first, so that every item keeps the position the
    /// semantic's own blocks give it. Only axes whose block grows are listed.
    pub fn collate_spreads(
        &self,
        name: &str,
        local: &BTreeMap<String, Vec<usize>>,
        target: &BTreeMap<String, Vec<usize>>,
    ) -> Vec<Spread> {
        let Some(t) = self.tensor(name) else {
            return Vec::new();
        };
        let (local, target) = (shape_pairs(local), shape_pairs(target));
        t.axes
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a.split, Split::Whole))
            .filter_map(|(axis, a)| {
                let of = a.semantic.as_deref()?;
                let old = self.mesh_split_length(of, local.iter().copied())?;
                let new = self.mesh_split_length(of, target.iter().copied())?;
                (old > 0 && new > old).then_some(Spread { axis, old, new })
            })
            .collect()
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
    use crate::mesh::Mesh;

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
        for sizes in [[1, 1], [2, 3], [3, 2], [4, 1]] {
            let mesh = Mesh::new(&sizes).unwrap();
            let local = [N / sizes[0], N / sizes[1], 4];
            let mut cover = vec![vec![0; N]; N];
            for c in mesh.coords() {
                let w = pair.block_window(&local, c);
                assert_eq!(w[2], (0, 4));
                for row in &mut cover[w[0].0..w[0].0 + w[0].1] {
                    for n in &mut row[w[1].0..w[1].0 + w[1].1] {
                        *n += 1;
                    }
                }
                let d = owner.block_window(&[N / sizes[0], N / sizes[0]], c);
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
            let diag = [N / sizes[0], N / sizes[0]];
            assert_eq!(
                owner.collated_global_shape(&diag, 1, 1, mesh),
                vec![1, N, N / sizes[0]]
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
        assert_eq!(
            plan.resolve(Mesh::new(&[2, 1]).unwrap(), &lengths, None),
            Err(expected.clone())
        );
        let owners = [(
            "atoms".to_owned(),
            super::Ownership::Owners(vec![0, 0, 1, 1]),
        )]
        .into();
        assert_eq!(
            plan.layout(Mesh::new(&[2, 1]).unwrap(), &lengths.sizes, &owners),
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
