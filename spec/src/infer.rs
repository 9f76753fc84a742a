//! The one placement inference: from axis semantics to DTensor placements.
//!
//! Walk the axes in order; each axis of a sharded semantic that is not co-sharded (and
//! not declared whole) takes the next free CP mesh axis (cp0, then cp1). Co-sharded
//! followers take their leader's mesh axis. Mesh axes left over are `Replicate()`.
//!
//! A one-axis CP mesh `(cp,)` splits one axis of a tensor: the first axis of a sharded
//! semantic that is not co-sharded and not kept whole (`replicate_axes`, or the
//! semantic's `on_1d: whole`). A pair's rows take it (a row slab), its columns stay
//! whole; two different semantics competing for it are refused by name. Co-sharded
//! followers stay whole there: a one-axis model reads its maps with global columns.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::diag::SpecError;
use crate::ir::*;

/// How one tensor axis is split over the CP mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Split {
    /// Not split: every rank holds the whole (padded) axis.
    Whole,
    /// Split evenly over a CP mesh axis (0 = cp0, 1 = cp1).
    Mesh {
        /// The mesh axis that splits it.
        mesh_axis: usize,
    },
    /// Co-sharded: takes the shard of tensor axis `leader` on `mesh_axis`; the holding
    /// rank keeps only its diagonal block (its own items).
    Follows {
        /// The tensor axis whose shard it takes.
        leader: usize,
        /// The mesh axis that splits the leader.
        mesh_axis: usize,
    },
}

impl Split {
    /// The mesh axis this tensor axis is divided by, if any.
    pub fn mesh_axis(self) -> Option<usize> {
        match self {
            Split::Whole => None,
            Split::Mesh { mesh_axis } | Split::Follows { mesh_axis, .. } => Some(mesh_axis),
        }
    }
}

/// The inferred layout of one tensor feature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inferred {
    /// How each tensor axis is split (or not) over the mesh.
    pub splits: Vec<Split>,
    /// Placements on the sample mesh (`(cp0, cp1)`, or the domain axes).
    pub placements: Vec<Placement>,
}

/// Infers one tensor feature's placement, checking an explicit placement against it.
pub fn infer(spec: &Spec, name: &str, t: &TensorFeature) -> Result<Inferred, Box<SpecError>> {
    let splits = splits(spec, name, t)?;
    let mesh_axes = spec.mesh.axes().len();
    let mut placements = vec![Placement::Replicate; mesh_axes];
    for (i, s) in splits.iter().enumerate() {
        if let Split::Mesh { mesh_axis } = s {
            placements[*mesh_axis] = Placement::Shard(i);
        }
    }
    if let Role::Index(IndexRole {
        scope: IndexScope::ShardLocal,
        one_hot: None,
        of,
        ..
    }) = &t.role
    {
        if splits.iter().all(|s| *s == Split::Whole) {
            return Err(Box::new(
                SpecError::new(
                    format!("shard-local ids of `{of}` need the feature itself to be sharded"),
                    t.role_loc,
                )
                .feature(name)
                .help("use `scope: padded_global` for a feature every rank holds whole"),
            ));
        }
    }
    check_explicit(spec, name, t, &placements)?;
    Ok(Inferred { splits, placements })
}

/// Every axis' split: sharded semantics take the mesh axes in order, co-sharded axes
/// follow their leader, replicated ones stay whole.
fn splits(spec: &Spec, name: &str, t: &TensorFeature) -> Result<Vec<Split>, Box<SpecError>> {
    if spec.mesh.is_cp_1d() {
        return one_axis_splits(spec, name, t);
    }
    let mut splits = vec![Split::Whole; t.axes.len()];
    let mesh_axes = spec.mesh.axes().len();
    let kind = if spec.mesh.is_domain() {
        "domain"
    } else {
        "CP"
    };
    let mut next_free = 0;
    for (i, axis) in t.axes.iter().enumerate() {
        if !candidate(spec, t, i) {
            continue;
        }
        if next_free == mesh_axes {
            return Err(Box::new(SpecError::new(
                format!(
                    "more sharded axes than the {mesh_axes} {kind} mesh axes: no mesh axis is left for this one"
                ),
                axis.loc,
            )
            .feature(name)
            .axis(i, &axis.kind)
            .help(format!(
                "keep it whole with `replicate_axes: [{i}]` (or another sharded axis)"
            ))));
        }
        splits[i] = Split::Mesh {
            mesh_axis: next_free,
        };
        next_free += 1;
    }
    for c in &t.coshard {
        if let (Some(Split::Mesh { mesh_axis }), Some(_)) =
            (splits.get(c.follows).copied(), splits.get(c.axis))
        {
            splits[c.axis] = Split::Follows {
                leader: c.follows,
                mesh_axis,
            };
        }
    }
    Ok(splits)
}

/// Whether axis `i` of `t` may take a mesh axis: its semantic is sharded, it is not a
/// co-sharded follower nor kept whole, and the feature is not replicated.
fn candidate(spec: &Spec, t: &TensorFeature, i: usize) -> bool {
    let sharded = t.axes[i]
        .semantic()
        .and_then(|s| spec.semantics.get(s))
        .is_some_and(|s| s.sharded && !(spec.mesh.is_cp_1d() && s.whole_on_1d));
    let follower = t.coshard.iter().any(|c| c.axis == i);
    let kept_whole = t.replicate_axes.iter().any(|(a, _)| *a == i);
    sharded && !follower && !kept_whole && !t.replicated
}

/// The splits on a one-axis CP mesh: the first candidate axis takes it; every other
/// axis stays whole. Candidates of two semantics are ambiguous and refused.
fn one_axis_splits(
    spec: &Spec,
    name: &str,
    t: &TensorFeature,
) -> Result<Vec<Split>, Box<SpecError>> {
    let mut splits = vec![Split::Whole; t.axes.len()];
    let mut candidates = (0..t.axes.len()).filter(|&i| candidate(spec, t, i));
    let Some(first) = candidates.next() else {
        return Ok(splits);
    };
    let semantic = t.axes[first].semantic();
    if let Some(other) = candidates.find(|&i| t.axes[i].semantic() != semantic) {
        let axis = &t.axes[other];
        return Err(Box::new(
            SpecError::new(
                format!(
                    "a one-axis CP mesh splits one axis of a tensor: axis {first} (`{}`) and axis {other} (`{}`) are both sharded",
                    semantic.unwrap_or_default(),
                    axis.semantic().unwrap_or_default(),
                ),
                axis.loc,
            )
            .feature(name)
            .axis(other, &axis.kind)
            .help(format!(
                "keep one whole: `replicate_axes: [{other}]` on the feature, or `on_1d: whole` on the semantic"
            )),
        ));
    }
    splits[first] = Split::Mesh { mesh_axis: 0 };
    Ok(splits)
}

/// An explicit `placement` must be the inferred one.
fn check_explicit(
    spec: &Spec,
    name: &str,
    t: &TensorFeature,
    placements: &[Placement],
) -> Result<(), Box<SpecError>> {
    let mesh_axes = spec.mesh.axes().len();
    if let Some((explicit, loc)) = &t.placement {
        if explicit.as_slice() != placements {
            let show = |p: &[Placement]| {
                p.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut e = SpecError::new(
                format!(
                    "explicit placement ({}) contradicts the inferred ({}) from the axis semantics",
                    show(explicit),
                    show(placements)
                ),
                *loc,
            )
            .feature(name);
            if explicit.len() != mesh_axes {
                let names: Vec<&str> = spec.mesh.axes().iter().map(|n| n.name.as_str()).collect();
                e = e.help(format!(
                    "a placement has {mesh_axes} entries, one per mesh axis ({})",
                    names.join(", ")
                ));
            } else if let Some((d, axis)) = explicit.iter().find_map(|p| match p {
                Placement::Shard(d) => t.axes.get(*d).map(|a| (*d, a)),
                Placement::Replicate => None,
            }) {
                e = e.axis(d, &axis.kind);
            }
            return Err(Box::new(e));
        }
    }
    Ok(())
}

/// Placements on `(dp, cp0, cp1)`: `Shard(0)` on dp, every CP `Shard(d)` becomes `Shard(d+1)`.
pub fn with_dp(cp: &[Placement]) -> Vec<Placement> {
    std::iter::once(Placement::Shard(0))
        .chain(cp.iter().map(|p| match p {
            Placement::Shard(d) => Placement::Shard(d + 1),
            Placement::Replicate => Placement::Replicate,
        }))
        .collect()
}
