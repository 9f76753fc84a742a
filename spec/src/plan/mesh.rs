//! The plan's mesh: its CP or domain axes, its DP axis, and a device mesh read by the
//! names of its dimensions.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::mesh::{sizes_text, DeviceMesh, Mesh, Named, MAX_MESH_AXES};

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

/// Meshes for this plan: named by its axes, and read from arguments.
impl MeshPlan {
    /// `mesh` with this plan's axis names.
    pub fn named(&self, mesh: Mesh) -> Named {
        Named(
            self.axes()
                .iter()
                .cloned()
                .zip(mesh.sizes().iter().copied())
                .collect(),
        )
    }

    /// The mesh a file names, checked against this plan: the plan's axes, in its
    /// order, each with a size. `Err` says what differs.
    pub fn mesh_of(&self, named: &Named) -> Result<Mesh, String> {
        let names: Vec<&String> = named.0.iter().map(|(n, _)| n).collect();
        if names.len() != self.axes().len() || names.iter().zip(self.axes()).any(|(a, b)| *a != b) {
            return Err(format!(
                "mesh {named} names axes ({}); the spec's mesh is ({})",
                names
                    .iter()
                    .map(|n| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                self.axes().join(", ")
            ));
        }
        let sizes: Vec<usize> = named.0.iter().map(|&(_, n)| n).collect();
        Mesh::new(&sizes)
    }

    /// Parses a `--mesh` argument for this plan: one size per axis (`3x3` on
    /// `(cp0, cp1)`, `8` on `(cp,)`), the DP size optionally in front (`2x3x3`), or the
    /// axes by name (`cp0=3,cp1=3`, `dp=2,cp=8`). Any other count or name is refused by
    /// name, never read as another mesh.
    pub fn parse(&self, s: &str) -> Result<DeviceMesh, String> {
        let bad = |why: String| format!("mesh `{s}`: {why}");
        let (dp, sizes) = if s.contains('=') {
            self.parse_named(s).map_err(bad)?
        } else {
            let sizes = s
                .split(['x', 'X'])
                .map(|p| p.trim().parse::<usize>().ok().filter(|&n| n > 0))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| bad("sizes must be positive integers: 3x3, 2x3x3 or 8".into()))?;
            let axes = self.axes().len();
            match sizes.len() {
                n if n == axes => (1, sizes),
                n if n == axes + 1 => (sizes[0], sizes[1..].to_vec()),
                n => {
                    return Err(bad(format!(
                        "{} for the spec's mesh ({}): one per axis ({}), the DP size optionally in front",
                        sizes_text(n),
                        self.axes().join(", "),
                        self.example(&sizes)
                    )))
                }
            }
        };
        let cp = self.matched(&sizes).map_err(bad)?;
        DeviceMesh::new(dp, cp).map_err(bad)
    }

    /// `dp=2,cp0=3,cp1=3`: every axis of the spec's mesh named once, `dp` optional.
    fn parse_named(&self, s: &str) -> Result<(usize, Vec<usize>), String> {
        let mut dp = None;
        let mut sizes = vec![None; self.axes().len()];
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, n) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}` is not AXIS=SIZE"))?;
            let n = n
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("`{part}`: the size must be a positive integer"))?;
            let name = name.trim();
            let slot = match self.axes().iter().position(|a| a == name) {
                Some(m) => &mut sizes[m],
                None if Some(name) == self.dp.as_deref() || (self.dp.is_none() && name == "dp") => {
                    &mut dp
                }
                None => {
                    return Err(format!(
                        "`{name}` is not an axis of the spec's mesh ({})",
                        self.axes().join(", ")
                    ))
                }
            };
            if slot.replace(n).is_some() {
                return Err(format!("axis `{name}` is given twice"));
            }
        }
        let sizes = sizes
            .into_iter()
            .zip(self.axes())
            .map(|(n, a)| n.ok_or_else(|| format!("no size for axis `{a}`")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((dp.unwrap_or(1), sizes))
    }

    /// A mesh of one size per axis of this plan's mesh, refused by name when the count
    /// is not the plan's: `3` is no `(cp0, cp1)` mesh, and `2x2` no `(cp,)` mesh.
    pub fn matched(&self, sizes: &[usize]) -> Result<Mesh, String> {
        if sizes.len() != self.axes().len() {
            return Err(format!(
                "sizes {sizes:?} for the spec's mesh ({}): one size per axis ({})",
                self.axes().join(", "),
                self.example(sizes)
            ));
        }
        Mesh::new(sizes)
    }

    /// `dp` replicas of a mesh of `sizes` for this plan (see [`MeshPlan::matched`]):
    /// more than one replica needs the spec's DP axis.
    pub fn replicated(&self, dp: usize, sizes: &[usize]) -> Result<DeviceMesh, String> {
        if dp > 1 && self.dp.is_none() {
            return Err(format!(
                "{dp} DP replicas, but the spec names no data-parallel mesh axis (`mesh.dp`)"
            ));
        }
        DeviceMesh::new(dp, self.matched(sizes)?)
    }

    /// The dimension names of a device mesh for this plan: the DP axis first where the
    /// spec names one, then the sample's axes.
    pub fn dim_names(&self) -> Vec<String> {
        self.dp.iter().chain(self.axes()).cloned().collect()
    }

    /// A mesh argument for this plan made of the sizes given, as an example of the
    /// form: `` `3` `` on one axis, `` `3x2` `` on two.
    pub fn example(&self, sizes: &[usize]) -> String {
        let first = sizes.first().copied().unwrap_or(3);
        match self.axes().len() {
            1 => format!("`{first}`"),
            _ => format!("`{first}x{}`", sizes.get(1).copied().unwrap_or(first)),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_mesh(axes: &[&str], dp: Option<&str>) -> MeshPlan {
        MeshPlan {
            split: crate::plan::SplitPlan::Cp(axes.iter().map(|a| a.to_string()).collect()),
            dp: dp.map(str::to_owned),
        }
    }

    #[test]
    fn parses_sizes_and_names_for_the_plan() {
        let tile = plan_mesh(&["cp0", "cp1"], Some("dp"));
        let axis = plan_mesh(&["cp"], None);
        let at = |p: &MeshPlan, s: &str| p.parse(s).map(|m| (m.dp, m.cp.sizes().to_vec()));
        assert_eq!(at(&tile, "3x3"), Ok((1, vec![3, 3])));
        assert_eq!(at(&tile, "2x2x3"), Ok((2, vec![2, 3])));
        assert_eq!(at(&tile, "cp1=3, cp0=2,dp=2"), Ok((2, vec![2, 3])));
        assert_eq!(at(&axis, "8"), Ok((1, vec![8])));
        assert_eq!(at(&axis, "2x3"), Ok((2, vec![3])));
        assert_eq!(at(&axis, "cp=4,dp=2"), Ok((2, vec![4])));
        for (p, bad, says) in [
            (&tile, "3", "1 size for the spec's mesh (cp0, cp1)"),
            (&axis, "2x2x2", "3 sizes for the spec's mesh (cp)"),
            (&tile, "2x0", "positive integers"),
            (&tile, "cp0=3", "no size for axis `cp1`"),
            (&tile, "cp0=3,cp0=3,cp1=1", "given twice"),
            (&axis, "cq=3", "`cq` is not an axis of the spec's mesh (cp)"),
        ] {
            let e = p.parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let named = tile.named(Mesh::new(&[3, 2]).unwrap());
        assert_eq!(named.to_string(), "3x2 (cp0, cp1)");
        assert_eq!(tile.mesh_of(&named).unwrap().sizes(), &[3, 2]);
        let e = axis.mesh_of(&named).unwrap_err();
        assert!(e.contains("the spec's mesh is (cp)"), "{e}");
    }

    /// Replicas in front of a mesh need the spec's DP axis; the device mesh's
    /// dimensions are named DP first.
    #[test]
    fn replicas_need_the_specs_dp_axis() {
        let tile = plan_mesh(&["cp0", "cp1"], Some("dp"));
        let axis = plan_mesh(&["cp"], None);
        let m = tile.replicated(2, &[3, 2]).unwrap();
        assert_eq!((m.dp, m.world()), (2, 12));
        assert_eq!(tile.dim_names(), ["dp", "cp0", "cp1"]);
        assert_eq!(axis.dim_names(), ["cp"]);
        assert_eq!(axis.replicated(1, &[4]).unwrap().world(), 4);
        let e = axis.replicated(2, &[4]).unwrap_err();
        assert!(e.contains("names no data-parallel mesh axis"), "{e}");
        let e = tile.replicated(1, &[4]).unwrap_err();
        assert!(e.contains("one size per axis"), "{e}");
    }
}
