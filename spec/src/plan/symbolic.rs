//! Shapes in terms of semantics, for explaining a plan without a sample: the same rules
//! as [`Plan::shapes_of`](super::Plan::shapes_of), with each length left as a name.

use std::fmt;

use super::{Padding, Plan, TensorPlan};
use crate::infer::Split;
use crate::mesh::Mesh;

/// One axis' extent, symbolic in the semantic's length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Extent {
    /// A channel axis of fixed size.
    Channel(u64),
    /// A semantic's length as it is (never padded on this mesh).
    Length(String),
    /// A semantic's length rounded up to a multiple: `pad6(tokens)`.
    Padded {
        /// The semantic.
        semantic: String,
        /// The multiple.
        multiple: usize,
    },
    /// An owner-partitioned semantic in its owner-block layout: `blocks6(atoms)`.
    Blocks {
        /// The semantic.
        semantic: String,
        /// How many owner blocks.
        blocks: usize,
    },
    /// An extent divided evenly over ranks: `pad6(tokens)/3`.
    Split(Box<Extent>, usize),
    /// An axis the plan does not size.
    Unknown,
}

impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Extent::Channel(n) => write!(f, "{n}"),
            Extent::Length(s) => f.write_str(s),
            Extent::Padded { semantic, multiple } => write!(f, "pad{multiple}({semantic})"),
            Extent::Blocks { semantic, blocks } => write!(f, "blocks{blocks}({semantic})"),
            Extent::Split(e, parts) => write!(f, "{e}/{parts}"),
            Extent::Unknown => f.write_str("?"),
        }
    }
}

/// A feature's global (DTensor) and local shapes, symbolic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolicShapes {
    /// The global shape: a co-sharded axis counts one diagonal block.
    pub global: Vec<Extent>,
    /// Each rank's block.
    pub local: Vec<Extent>,
}

impl Plan {
    /// The padded extent of every axis of `t` on `mesh`, before any split.
    fn padded_extent(&self, semantic: Option<&str>, size: Option<u64>, mesh: Mesh) -> Extent {
        let Some(s) = semantic else {
            return size.map_or(Extent::Unknown, Extent::Channel);
        };
        let m = self.pad_multiple(s, mesh);
        match self.semantics.get(s).map(|p| &p.padding) {
            Some(Padding::OwnerBlocks { .. }) => Extent::Blocks {
                semantic: s.to_owned(),
                blocks: m,
            },
            _ if m > 1 => Extent::Padded {
                semantic: s.to_owned(),
                multiple: m,
            },
            _ => Extent::Length(s.to_owned()),
        }
    }

    /// A feature's shapes on `mesh` in terms of its semantics' lengths.
    pub fn symbolic_shapes(&self, t: &TensorPlan, mesh: Mesh) -> SymbolicShapes {
        let (mut global, mut local) = (Vec::new(), Vec::new());
        for a in &t.axes {
            let full = self.padded_extent(a.semantic.as_deref(), a.size, mesh);
            let part = match a.split.mesh_axis().map(|m| mesh.size(m)).filter(|&d| d > 1) {
                Some(d) => Extent::Split(Box::new(full.clone()), d),
                None => full.clone(),
            };
            global.push(match a.split {
                Split::Follows { .. } => part.clone(),
                _ => full,
            });
            local.push(part);
        }
        SymbolicShapes { global, local }
    }
}

/// `n` items spread as evenly as they go over `parts` owners, the first ones one more:
/// the owner counts `explain` assumes when only lengths are given.
pub fn spread_evenly(n: usize, parts: usize) -> Vec<usize> {
    (0..parts)
        .map(|i| n / parts + usize::from(i < n % parts))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_render_as_explain_shows_them_and_spreads_sum_to_the_items() {
        let e = Extent::Split(
            Box::new(Extent::Padded {
                semantic: "tokens".into(),
                multiple: 6,
            }),
            2,
        );
        assert_eq!(e.to_string(), "pad6(tokens)/2");
        let b = Extent::Blocks {
            semantic: "atoms".into(),
            blocks: 6,
        };
        assert_eq!(b.to_string(), "blocks6(atoms)");
        assert_eq!(spread_evenly(7, 3), vec![3, 2, 2]);
        assert_eq!(spread_evenly(2, 4), vec![1, 1, 0, 0]);
        assert_eq!(spread_evenly(0, 2).iter().sum::<usize>(), 0);
    }
}
