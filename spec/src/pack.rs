//! The packed layout for windowed attention over an owner-partitioned semantic.
//!
//! Windowed atom attention wants atoms left-packed: real items in serial order, the
//! axis padded at the end to a multiple of `W x cp0` (`W` the semantic's `window`) and
//! split evenly over cp0. One-hot maps along or into the packed axis become id
//! vectors (`atom_to_token` -> the global token id of every atom), never a packed
//! one-hot: ids index global layouts, with -1 at pads.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::infer::Split;
use crate::ir::{PadValue, Placement, Role};
use crate::layout::round_up;
use crate::mesh::{Coord, Mesh};
use crate::plan::{FeaturePlan, Plan, SampleLayout};

/// Id value at pads of a packed id vector.
pub const PAD_ID: i64 = -1;

/// How every feature touching a windowed semantic looks once packed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PackPlan {
    /// The packed (windowed) semantic, e.g. `atoms`.
    pub semantic: String,
    /// Its attention window `W`.
    pub window: u32,
    /// Every feature with an axis of the packed semantic, by name.
    pub features: BTreeMap<String, PackedFeature>,
}

/// One feature once packed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PackedFeature {
    /// How its values change when packed.
    pub form: PackedForm,
    /// Semantic of every axis of the packed tensor (`None`: channel).
    pub axes: Vec<Option<String>>,
    /// How each axis of the packed tensor is split over the CP mesh.
    pub splits: Vec<Split>,
    /// Placements of the packed tensor on `(cp0, cp1)`.
    pub placements: Vec<Placement>,
    /// The value at pad positions.
    pub pad_value: PadValue,
}

impl PackedFeature {
    /// The region of its packed tensor of `shape` the rank at `coord` of `mesh` holds,
    /// `(start, len)` per axis.
    pub fn block_window(&self, shape: &[usize], mesh: Mesh, coord: Coord) -> Vec<(usize, usize)> {
        self.splits
            .iter()
            .zip(shape)
            .map(|(s, &n)| match s.mesh_axis() {
                Some(m) => {
                    let len = n / mesh.size(m).max(1);
                    (coord.get(m) * len, len)
                }
                None => (0, n),
            })
            .collect()
    }

    /// Every axis of its packed tensor, from a source of `source` shape: its length and
    /// the padded position of each source item (`None`: items keep their place and the
    /// end is padded). The packed semantic's axes are `packed_len` long; another
    /// semantic's as `layout` pads it; a channel keeps its length.
    pub fn axes<'l>(
        &self,
        packed: &str,
        layout: &'l SampleLayout,
        packed_len: usize,
        source: &[usize],
    ) -> Vec<(usize, Option<&'l [usize]>)> {
        self.axes
            .iter()
            .zip(source)
            .map(|(s, &n)| match s.as_deref() {
                Some(s) if s == packed => (packed_len, None),
                Some(s) => (
                    layout.padded.get(s).copied().unwrap_or(0),
                    layout.positions.get(s).map(Vec::as_slice),
                ),
                None => (n, None),
            })
            .collect()
    }
}

/// How a feature's values change when its semantic is packed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum PackedForm {
    /// The packed axes end-padded; everything else as in the plan.
    Padded,
    /// Index values into the packed semantic: serial ids are packed ids, so values
    /// are kept; other axes as in the plan.
    SerialIds,
    /// A one-hot map with `axis` removed: each row holds the global id of its one
    /// (`-1` for a row without one, and at pads). Ids index `of`'s global layout.
    Ids {
        /// The one-hot axis removed.
        axis: usize,
        /// The semantic the ids point at.
        of: String,
    },
}

impl Plan {
    /// Semantics with a `window`, which can be packed.
    pub fn windowed(&self) -> impl Iterator<Item = (&str, u32)> {
        self.semantics
            .iter()
            .filter_map(|(n, s)| s.window.map(|w| (n.as_str(), w)))
    }

    /// Length of the packed axis: `len` rounded up to a multiple of `window x cp0`.
    pub fn packed_length(window: u32, len: usize, mesh: Mesh) -> usize {
        round_up(len, window as usize * mesh.size(0))
    }

    /// The packed form of every feature of the spec that has a `semantic` axis or a
    /// one-hot index into it. `None` if `semantic` has no window.
    pub fn pack_plan(&self, semantic: &str) -> Option<PackPlan> {
        let window = self.semantics.get(semantic)?.window?;
        let mut features = BTreeMap::new();
        for (name, f) in &self.features {
            let FeaturePlan::Tensor(t) = f else { continue };
            let on_axis = |s: &Option<String>| s.as_deref() == Some(semantic);
            let touches = t.axes.iter().any(|a| on_axis(&a.semantic));
            let (form, kept): (PackedForm, Vec<usize>) = match &t.role {
                Role::Index(ix) if touches && ix.one_hot.is_some() => {
                    let axis = ix.one_hot.unwrap_or_default();
                    (
                        PackedForm::Ids {
                            axis,
                            of: ix.of.clone(),
                        },
                        (0..t.axes.len()).filter(|&d| d != axis).collect(),
                    )
                }
                // Left-packed items keep their serial ids, so value indices into the
                // packed semantic stay as they are.
                Role::Index(ix) if ix.of == semantic && ix.one_hot.is_none() => {
                    (PackedForm::SerialIds, (0..t.axes.len()).collect())
                }
                _ if touches => (PackedForm::Padded, (0..t.axes.len()).collect()),
                _ => continue,
            };
            // The first packed axis takes cp0; other axes keep the plan's split when
            // it is on a mesh axis the packed axis does not use; the rest stay whole.
            let first_packed = kept.iter().position(|&d| on_axis(&t.axes[d].semantic));
            let mut splits = Vec::with_capacity(kept.len());
            for (i, &d) in kept.iter().enumerate() {
                let a = &t.axes[d];
                let split = if Some(i) == first_packed {
                    Split::Mesh { mesh_axis: 0 }
                } else if on_axis(&a.semantic) {
                    Split::Whole
                } else {
                    match a.split {
                        Split::Mesh { mesh_axis } if first_packed.is_none() || mesh_axis != 0 => {
                            Split::Mesh { mesh_axis }
                        }
                        _ => Split::Whole,
                    }
                };
                splits.push(split);
            }
            let mut placements = vec![Placement::Replicate; self.mesh.axes().len()];
            for (i, s) in splits.iter().enumerate() {
                if let Split::Mesh { mesh_axis } = s {
                    placements[*mesh_axis] = Placement::Shard(i);
                }
            }
            let pad_value = match form {
                PackedForm::Ids { .. } => PadValue::Int(PAD_ID),
                PackedForm::Padded | PackedForm::SerialIds => t.pad_value,
            };
            features.insert(
                name.clone(),
                PackedFeature {
                    axes: kept.iter().map(|&d| t.axes[d].semantic.clone()).collect(),
                    form,
                    splits,
                    placements,
                    pad_value,
                },
            );
        }
        Some(PackPlan {
            semantic: semantic.to_owned(),
            window,
            features,
        })
    }
}
