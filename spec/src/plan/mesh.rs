//! The plan's mesh: its CP or domain axes, its DP axis, and a device mesh read by the
//! names of its dimensions.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::mesh::MAX_MESH_AXES;

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
                "device mesh dimension `{n}` is not an axis of the spec's mesh {}: {}",
                expected(),
                self.how_to_match(names)
            ));
        }
        let dp = self
            .dp
            .as_ref()
            .and_then(|d| names.iter().position(|n| n == d));
        let start = usize::from(dp.is_some());
        if dp.is_some_and(|d| d != 0) || names[start..] != *axes || names.len() != ndim {
            return Err(format!(
                "device mesh dimensions ({}) are not the spec's mesh {} in its order: {}",
                names.join(", "),
                expected(),
                self.how_to_match(names)
            ));
        }
        Ok(MeshDims {
            dp,
            sample: (start..ndim).collect(),
        })
    }

    /// How a device mesh named `names` and the spec's mesh come to match: the device
    /// mesh's names as the spec says them, or the spec's `mesh:` line as the device mesh
    /// names its dimensions (where there are as many).
    fn how_to_match(&self, names: &[String]) -> String {
        let quoted = |v: &[String]| v.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>();
        let axes = self.axes();
        let with_dp = names.len() > axes.len();
        let mut ours: Vec<String> = self.dp.iter().filter(|_| with_dp).cloned().collect();
        ours.extend(axes.iter().cloned());
        let mut out = format!(
            "name the device mesh's dimensions as the spec does (`mesh_dim_names=({},)`)",
            quoted(&ours).join(", ")
        );
        let cp = names.len() - usize::from(with_dp && self.dp.is_some());
        if cp == axes.len() && (1..=2).contains(&cp) {
            let (dp, theirs) = names.split_at(names.len() - cp);
            let dp = dp.first().map(|d| format!(", dp: {d}")).unwrap_or_default();
            let _ = write!(
                out,
                ", or the spec's mesh as the model names it (`mesh: {{cp: [{}]{dp}}}`)",
                theirs.join(", ")
            );
        }
        out
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
            None if (1..=MAX_MESH_AXES).contains(&r.cp.len()) => SplitPlan::Cp(r.cp),
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
