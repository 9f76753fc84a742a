//! A plan evaluated for one sample on one mesh: every feature's shapes.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Serialize;

use super::*;
use crate::mesh::Mesh;

/// A plan evaluated for one mesh and one sample's lengths.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct Resolved {
    /// Mesh sizes `(cp0, cp1)`.
    pub mesh: Mesh,
    /// Padded length of every semantic that was given a length.
    pub padded: BTreeMap<String, usize>,
    /// Block layout of every owner-partitioned semantic.
    pub blocks: BTreeMap<String, BlockLayout>,
    /// Every feature's shapes, by name.
    pub features: BTreeMap<String, FeatureShapes>,
}

/// One feature's shapes on one mesh for one sample.
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
    /// The value at pad positions.
    pub pad_value: PadValue,
}

impl Plan {
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
            let Some(t) = self.tensor(name) else {
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
                let uneven = |m: usize| self.mesh.uneven(m);
                let (global, local) = match a.split {
                    Split::Whole => (full, full),
                    // Uneven shards differ per rank; the largest (the first) is shown.
                    Split::Mesh { mesh_axis } if uneven(mesh_axis) => {
                        let ranks = mesh.size(mesh_axis);
                        let sizes =
                            chunk_sizes(full, ranks).ok_or_else(|| ResolveError::EmptyShard {
                                feature: name.to_owned(),
                                axis: i,
                                semantic: a.semantic.clone().unwrap_or_default(),
                                len: full,
                                ranks,
                                mesh_axis: self
                                    .mesh
                                    .axes()
                                    .get(mesh_axis)
                                    .cloned()
                                    .unwrap_or_default(),
                            })?;
                        self.check_shard_rule(name, i, a.semantic.as_deref(), mesh_axis, &sizes)?;
                        (full, sizes[0])
                    }
                    Split::Mesh { mesh_axis } => (full, full / mesh.size(mesh_axis)),
                    Split::Follows { mesh_axis, .. } => {
                        let block = full / mesh.size(mesh_axis);
                        (block, block)
                    }
                };
                shapes.serial_shape.push(serial);
                shapes.padded_shape.push(full);
                shapes.global_shape.push(global);
                shapes.local_shape.push(local);
            }
            if let Some(size) = t.derived.as_ref().and_then(DeriveRule::halo) {
                halo_rows(t, mesh, size, &mut shapes);
            }
            features.insert(name.to_owned(), shapes);
        }
        Ok(features)
    }
}

/// A key halo's first axis: `2 x size` rows a rank, each block's before and after it; its
/// whole (what every rank's halo makes together, the DTensor's global shape) one halo per
/// shard of the axis, in shard order. It exists laid out only: its serial shape is the
/// same.
fn halo_rows(t: &TensorPlan, mesh: Mesh, size: usize, shapes: &mut FeatureShapes) {
    let shards = t
        .axes
        .first()
        .and_then(|a| a.split.mesh_axis())
        .map_or(1, |m| mesh.size(m));
    let local = size.saturating_mul(2);
    let whole = local.saturating_mul(shards);
    for (v, n) in [
        (&mut shapes.serial_shape, whole),
        (&mut shapes.padded_shape, whole),
        (&mut shapes.global_shape, whole),
        (&mut shapes.local_shape, local),
    ] {
        if let Some(first) = v.first_mut() {
            *first = n;
        }
    }
}
