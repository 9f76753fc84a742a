//! Building a plan: a checked spec's placements, padding and remaps.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::check;
use crate::diag::SpecError;
use crate::infer;
use crate::ownership::OwnerChains;

/// Validates a spec and builds its plan; every error is returned, none is dropped.
pub fn plan(spec: &Spec) -> Result<Plan, Vec<SpecError>> {
    let errors = check::check(spec);
    if !errors.is_empty() {
        return Err(errors);
    }
    let (inferred, mut errors) = infer_all(spec);
    errors.extend(check::split_alignment(spec, &inferred));
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
    for (name, f) in &spec.features {
        let plan = match (&f.kind, inferred.get(name.as_str())) {
            (FeatureKind::Tensor(t), Some(i)) => {
                FeaturePlan::Tensor(Box::new(tensor_plan(spec, f, t, i, workflows_of(name))))
            }
            _ => FeaturePlan::Metadata {
                workflows: workflows_of(name),
                optional: f.optional.is_some(),
            },
        };
        features.insert(name.clone(), plan);
    }
    Ok(Plan {
        version: PLAN_VERSION,
        module: spec.module.name.clone(),
        source: spec.source.clone(),
        mesh: mesh_plan(&spec.mesh),
        semantics: semantic_plans(spec, &inferred),
        features,
        workflows: workflows
            .into_iter()
            .map(|(w, fs)| (w, fs.into_iter().collect()))
            .collect(),
        inputs: InputsPlan {
            other_keys: spec.inputs.other_keys,
            separator: spec.inputs.separator.name.clone(),
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

/// Every tensor feature's inferred splits and placements, and every feature's error.
fn infer_all(spec: &Spec) -> (BTreeMap<&str, infer::Inferred>, Vec<SpecError>) {
    let mut out = BTreeMap::new();
    let mut errors = Vec::new();
    for (name, _, t) in spec.tensors() {
        match infer::infer(spec, name, t) {
            Ok(i) => {
                out.insert(name, i);
            }
            Err(e) => errors.push(*e),
        }
    }
    (out, errors)
}

fn tensor_plan(
    spec: &Spec,
    f: &Feature,
    t: &TensorFeature,
    inferred: &infer::Inferred,
    workflows: Vec<String>,
) -> TensorPlan {
    TensorPlan {
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
        one_hot: t.one_hot.map(|(axis, _)| axis),
        sparse: t.sparse.is_some(),
        range: t.range.map(|(r, _)| r),
        remap: remap(spec, t, &inferred.splits),
        workflows,
        optional: f.optional.is_some(),
        derived: t.derived.as_ref().map(|d| d.rule.clone()),
        parameter: t.parameter.is_some(),
        output: t.output.is_some(),
        given: t.given.clone(),
    }
}

/// Every semantic's plan: the mesh axes that split it, its padding, its masks.
fn semantic_plans(
    spec: &Spec,
    inferred: &BTreeMap<&str, infer::Inferred>,
) -> BTreeMap<String, SemanticPlan> {
    let mut sharded_on: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    let mut masked_by: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, _, t) in spec.tensors() {
        if let Some(i) = inferred.get(name) {
            for (axis, split) in t.axes.iter().zip(&i.splits) {
                if let (Some(s), Some(m)) = (axis.semantic(), split.mesh_axis()) {
                    sharded_on.entry(s).or_default().insert(m);
                }
            }
        }
        if let Role::Mask { of } = &t.role {
            for s in of {
                masked_by
                    .entry(s.as_str())
                    .or_default()
                    .push(name.to_owned());
            }
        }
    }
    let roots = roots_of(spec);
    spec.semantics
        .values()
        .map(|s| {
            let own: Vec<usize> = sharded_on
                .get(s.name.as_str())
                .map(|m| m.iter().copied().collect())
                .unwrap_or_default();
            let plan = SemanticPlan {
                sharded: s.sharded,
                batch: s.batch,
                sharded_on: own,
                padding: padding(spec, s, &roots, &sharded_on),
                masked_by: masked_by.remove(s.name.as_str()).unwrap_or_default(),
                window: s.window,
                incoming: s.incoming.as_ref().map(|i| i.source.clone()),
                incoming_map_pad: s.incoming.as_ref().and_then(|i| Some(i.map_pad?.0)),
                unowned_rows_are_pads: s.unowned_rows.is_some(),
                owned_by: owned_by(spec, s, &roots, &sharded_on),
                stride: s.shards.stride.unwrap_or(1).max(1),
                halo: s.shards.halo.unwrap_or(0),
            };
            (s.name.clone(), plan)
        })
        .collect()
}

/// The root of every semantic's ownership tree: its farthest owner reached through
/// sharded owners only.
fn roots_of(spec: &Spec) -> BTreeMap<&str, &str> {
    let ownership = OwnerChains::of(spec);
    spec.semantics
        .keys()
        .map(|name| {
            let root = ownership
                .owners(name)
                .iter()
                .take_while(|o| spec.semantics.get(**o).is_some_and(|s| s.sharded))
                .last()
                .copied()
                .unwrap_or(name.as_str());
            (name.as_str(), root)
        })
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
    let root = roots
        .get(s.name.as_str())
        .copied()
        .unwrap_or(s.name.as_str());
    let members = spec
        .semantics
        .values()
        .filter(|m| m.sharded && roots.get(m.name.as_str()) == Some(&root));
    let mesh_axes: Vec<usize> = members
        .filter_map(|m| sharded_on.get(m.name.as_str()))
        .flatten()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // Uneven domain axes split by chunks: nothing to pad for them.
    let mesh_axes: Vec<usize> = mesh_axes
        .into_iter()
        .filter(|&m| !spec.mesh.uneven(m))
        .collect();
    if mesh_axes.is_empty() {
        return Padding::None;
    }
    if s.windows.is_some() {
        // Windowed attention over serial items: every rank a whole number of windows,
        // by the mesh axes that split this semantic (not its owner's others).
        let own: Vec<usize> = mesh_axes
            .iter()
            .copied()
            .filter(|m| {
                sharded_on
                    .get(s.name.as_str())
                    .is_some_and(|on| on.contains(m))
            })
            .collect();
        return Padding::Multiple {
            mesh_axes: if own.is_empty() { mesh_axes } else { own },
            window: s.window,
            whole_windows: true,
        };
    }
    match &s.owner {
        // A one-axis model reads owned items in serial order, split evenly (its maps
        // keep global columns); padded to a multiple of the window too, since windowed
        // attention runs over the whole axis.
        Some(_) if spec.mesh.is_cp_1d() => Padding::Multiple {
            mesh_axes,
            window: s.window,
            whole_windows: false,
        },
        Some(o) if root != s.name => Padding::OwnerBlocks {
            owner: o.owner.name.clone(),
            root: root.to_owned(),
            source: o.source.clone(),
            mesh_axes,
        },
        // A semantic of its own pads to its window too where windowed attention runs
        // over its whole axis (one CP axis); a tile splits it in blocks of their own.
        _ => Padding::Multiple {
            mesh_axes,
            window: s.window.filter(|_| spec.mesh.is_cp_1d()),
            whole_windows: false,
        },
    }
}

/// The ownership of a sharded owned semantic whose root is another semantic: what a 2-D
/// tile lays out in owner blocks, and what intake checks on any mesh.
fn owned_by(
    spec: &Spec,
    s: &Semantic,
    roots: &BTreeMap<&str, &str>,
    sharded_on: &BTreeMap<&str, BTreeSet<usize>>,
) -> Option<OwnedBy> {
    let on_axes = !matches!(padding(spec, s, roots, sharded_on), Padding::None);
    let root = roots.get(s.name.as_str()).copied()?;
    match &s.owner {
        Some(o) if on_axes && root != s.name => Some(OwnedBy {
            owner: o.owner.name.clone(),
            root: root.to_owned(),
            source: o.source.clone(),
        }),
        _ => None,
    }
}

fn remap(spec: &Spec, t: &TensorFeature, splits: &[Split]) -> Remap {
    let Role::Index(ix) = &t.role else {
        return Remap::None;
    };
    // A one-axis mesh keeps co-sharded maps whole and owned items in serial order, not
    // in their owner's block: ids of a map and of an owner stay global there, and so do
    // ids of owned items in serial order (a token's atom lies on any shard).
    let global = serial_items(spec, t) && (ix.one_hot.is_some() || ids_of_owner(spec, t, &ix.of))
        || spec
            .semantics
            .get(&ix.of)
            .is_some_and(|s| s.sharded && s.owner.is_some() && in_serial_order(spec, s));
    let scope = match ix.scope {
        IndexScope::ShardLocal if global => IndexScope::PaddedGlobal,
        scope => scope,
    };
    match (ix.one_hot, scope) {
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
            // Collate pads every block of a sharded semantic at its end, in owner
            // blocks and in serial order alike: its positions move.
            repad: spec.semantics.get(&ix.of).is_some_and(|s| s.sharded),
        },
        (None, IndexScope::ShardLocal) => Remap::ShardLocal {
            of: ix.of.clone(),
            mesh_axis: splits.iter().find_map(|s| s.mesh_axis()).unwrap_or(0),
        },
    }
}

/// Whether a semantic's items lie in serial order, never in their owner's block: on one
/// CP axis, or where it declares `layout: windows`.
fn in_serial_order(spec: &Spec, s: &Semantic) -> bool {
    spec.mesh.is_cp_1d() || s.windows.is_some()
}

/// Whether the owned items along `t`'s axes lie in serial order (see
/// [`in_serial_order`]): no diagonal block, no shard-local id of their owner.
fn serial_items(spec: &Spec, t: &TensorFeature) -> bool {
    spec.mesh.is_cp_1d()
        || t.axes
            .iter()
            .filter_map(Axis::semantic)
            .filter_map(|s| spec.semantics.get(s))
            .any(|s| in_serial_order(spec, s))
}

/// Whether `t` holds ids of an owner (direct or not) of the items along one of its axes
/// (a token id per atom).
fn ids_of_owner(spec: &Spec, t: &TensorFeature, of: &str) -> bool {
    t.axes.iter().filter_map(Axis::semantic).any(|s| {
        let mut at = spec.semantics.get(s);
        for _ in 0..spec.semantics.len() {
            let Some(owner) = at.and_then(|x| x.owner.as_ref()) else {
                return false;
            };
            if owner.owner.name == of {
                return true;
            }
            at = spec.semantics.get(&owner.owner.name);
        }
        false
    })
}

fn mesh_plan(mesh: &Mesh) -> MeshPlan {
    let name = |n: &Named| n.name.clone();
    let split = match &mesh.split {
        MeshSplit::Cp(axes) => SplitPlan::Cp(axes.iter().map(name).collect()),
        MeshSplit::Domain { axes, uneven } => SplitPlan::Domain {
            axes: axes.iter().map(name).collect(),
            uneven: uneven.clone(),
        },
    };
    MeshPlan {
        split,
        dp: mesh.dp.as_ref().map(name),
    }
}
