//! Resolving a plan for one sample on one mesh: padded lengths, layouts and shapes.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::layout::{lcm_of, owner_block, round_up};
use crate::mesh::{Coord, Mesh};

/// Run-time sizes of one sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lengths {
    /// Length of every semantic's axes (unpadded).
    pub sizes: BTreeMap<String, usize>,
    /// For each owner-partitioned semantic: its item count per root owner.
    pub counts: BTreeMap<String, RootCounts>,
}

/// How many items each root owner of an owner-partitioned semantic holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootCounts {
    /// Per root owner, in order.
    Each(Vec<usize>),
    /// Spread evenly ([`super::spread_evenly`]), as `explain` assumes: no list to
    /// hold, so the layout costs as much at 2^27 items as at 10.
    Even,
}

impl RootCounts {
    /// Items held by root owners `from..to` of `owners`, the semantic holding `n`.
    fn items(&self, n: usize, owners: usize, from: usize, to: usize) -> usize {
        match self {
            RootCounts::Each(c) => c[from.min(c.len())..to.min(c.len())].iter().sum(),
            RootCounts::Even if owners == 0 => 0,
            RootCounts::Even => {
                let (each, extra) = (n / owners, n % owners);
                (to - from) * each + extra.min(to).saturating_sub(from)
            }
        }
    }
}

impl Plan {
    /// The padding multiple of a semantic on this mesh (1 when never padded): the lcm
    /// of the sizes of the mesh axes that split it, times its stride.
    pub fn pad_multiple(&self, semantic: &str, mesh: Mesh) -> usize {
        let Some(s) = self.semantics.get(semantic) else {
            return 1;
        };
        match &s.padding {
            Padding::Multiple {
                mesh_axes,
                window,
                whole_windows,
            } => {
                let window = window.map_or(1, |w| w as usize);
                let sizes = mesh_axes.iter().map(|&m| mesh.size(m));
                let multiple = match whole_windows {
                    true => lcm_of(sizes) * window,
                    false => lcm_of(sizes.chain([window])),
                };
                multiple * s.stride.max(1) as usize
            }
            Padding::OwnerBlocks { mesh_axes, .. } => {
                lcm_of(mesh_axes.iter().map(|&m| mesh.size(m)))
            }
            Padding::None => 1,
        }
    }

    /// The `torch.chunk` pieces of an uneven axis must meet its semantic's stride and
    /// halo: nothing can be padded to make them.
    pub(super) fn check_shard_rule(
        &self,
        feature: &str,
        axis: usize,
        semantic: Option<&str>,
        mesh_axis: usize,
        sizes: &[usize],
    ) -> Result<(), ResolveError> {
        let Some((name, s)) = semantic.and_then(|n| Some((n, self.semantics.get(n)?))) else {
            return Ok(());
        };
        if s.admits_shards(sizes) {
            return Ok(());
        }
        Err(ResolveError::ShardRule(Box::new(ShardBreach {
            feature: feature.to_owned(),
            axis,
            semantic: name.to_owned(),
            len: sizes.iter().sum(),
            ranks: sizes.len(),
            mesh_axis: self.mesh.axes().get(mesh_axis).cloned().unwrap_or_default(),
            sizes: sizes.to_vec(),
            stride: s.stride,
            halo: s.halo,
        })))
    }

    /// The padded length of a semantic's axes for `len` items: a multiple of
    /// [`Plan::pad_multiple`], and long enough that every shard holds its halo.
    pub fn padded_length(&self, semantic: &str, len: usize, mesh: Mesh) -> usize {
        let halo_min = match self.semantics.get(semantic) {
            Some(SemanticPlan {
                padding: Padding::Multiple { mesh_axes, .. },
                halo,
                ..
            }) => {
                let most = mesh_axes.iter().map(|&m| mesh.size(m)).max().unwrap_or(1);
                *halo as usize * most
            }
            _ => 0,
        };
        round_up(len.max(halo_min), self.pad_multiple(semantic, mesh))
    }

    /// Evaluates the plan for a mesh and one sample's lengths, for the features of
    /// `workflow` (all features for `None`). Owner counts are per root owner.
    pub fn resolve(
        &self,
        mesh: Mesh,
        lengths: &Lengths,
        workflow: Option<&str>,
    ) -> Result<Resolved, ResolveError> {
        let mut layout = self.unowned_layout(mesh, &lengths.sizes)?;
        for (name, s) in &self.semantics {
            let Padding::OwnerBlocks { root, .. } = &s.padding else {
                continue;
            };
            let Some(&len) = lengths.sizes.get(name) else {
                continue;
            };
            let counts = lengths
                .counts
                .get(name)
                .ok_or_else(|| ResolveError::MissingCounts {
                    semantic: name.clone(),
                })?;
            let root_len = lengths.sizes.get(root).copied().ok_or_else(|| {
                ResolveError::MissingOwnerLength {
                    semantic: name.to_string(),
                    owner: root.clone(),
                }
            })?;
            match counts {
                RootCounts::Each(c) => check_counts(name, root, c, root_len, len)?,
                // Items spread over no owners would vanish from the layout.
                RootCounts::Even if root_len == 0 && len > 0 => {
                    return Err(ResolveError::NoOwners {
                        semantic: name.clone(),
                        owner: root.clone(),
                        len,
                    })
                }
                RootCounts::Even => {}
            }
            let root_padded = layout.padded.get(root).copied().unwrap_or(root_len);
            let blocks = self.pad_multiple(name, mesh).max(1);
            let per = (root_padded / blocks).max(1);
            let block_counts: Vec<usize> = (0..blocks)
                .map(|b| {
                    let from = (b * per).min(root_len);
                    let to = if b + 1 == blocks {
                        root_len
                    } else {
                        ((b + 1) * per).min(root_len)
                    };
                    counts.items(len, root_len, from, to)
                })
                .collect();
            let l = BlockLayout {
                blocks,
                per_block: block_counts.iter().copied().max().unwrap_or(0),
                block_counts,
            };
            layout.padded.insert(name.clone(), l.padded());
            layout.blocks.insert(name.clone(), l);
        }
        let features = self.shapes(&layout, workflow)?;
        Ok(Resolved {
            mesh,
            padded: layout.padded,
            blocks: layout.blocks,
            features,
        })
    }

    /// The padded layout of one sample: its lengths and, for every owner-partitioned
    /// semantic, who owns each item (as the spec's owner source gives it).
    pub fn layout(
        &self,
        mesh: Mesh,
        sizes: &BTreeMap<String, usize>,
        owners: &BTreeMap<String, Ownership>,
    ) -> Result<SampleLayout, ResolveError> {
        // Chain each owned semantic to its root: owners before what they own.
        let mut roots: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for name in self.semantic_order() {
            let Some(SemanticPlan {
                padding: Padding::OwnerBlocks { owner, .. },
                ..
            }) = self.semantics.get(name)
            else {
                continue;
            };
            let Some(&len) = sizes.get(name) else {
                continue;
            };
            let owner_len = *sizes
                .get(owner)
                .ok_or_else(|| ResolveError::MissingOwnerLength {
                    semantic: name.to_string(),
                    owner: owner.clone(),
                })?;
            let direct: Vec<usize> = match owners.get(name) {
                None => {
                    return Err(ResolveError::MissingCounts {
                        semantic: name.to_owned(),
                    })
                }
                Some(Ownership::Counts(counts)) => {
                    check_counts(name, owner, counts, owner_len, len)?;
                    counts
                        .iter()
                        .enumerate()
                        .flat_map(|(o, &c)| std::iter::repeat_n(o, c))
                        .collect()
                }
                Some(Ownership::Owners(of_items)) => {
                    if of_items.len() != len {
                        return Err(ResolveError::CountsSum {
                            semantic: name.to_owned(),
                            expected: len,
                            got: Some(of_items.len()),
                        });
                    }
                    if let Some(&bad) = of_items.iter().find(|&&o| o >= owner_len) {
                        return Err(ResolveError::OwnerOutOfRange {
                            semantic: name.to_owned(),
                            owner: owner.clone(),
                            index: bad,
                            len: owner_len,
                        });
                    }
                    of_items.clone()
                }
            };
            let root_of_items = match roots.get(owner.as_str()) {
                Some(owner_roots) => direct.iter().map(|&o| owner_roots[o]).collect(),
                None => direct,
            };
            roots.insert(name.to_owned(), root_of_items);
        }
        self.layout_from_roots(mesh, sizes, roots)
    }

    /// [`Plan::layout`] of arguments from outside (the Python package's): `Err` naming
    /// the argument unless every length in `sizes` is a semantic of the plan within the
    /// limits and `mesh` has one size per axis of the plan's mesh ([`MeshPlan::matched`]).
    pub fn checked_layout(
        &self,
        mesh: &[usize],
        sizes: &BTreeMap<String, usize>,
        ownership: &BTreeMap<String, Ownership>,
    ) -> Result<SampleLayout, String> {
        for (semantic, &n) in sizes {
            crate::limits::check_length(semantic, n).map_err(|e| format!("sizes: {e}"))?;
            if !self.semantics.contains_key(semantic) {
                return Err(format!("sizes: `{semantic}` is not a semantic of the spec"));
            }
        }
        let mesh = self.mesh.matched(mesh)?;
        self.layout(mesh, sizes, ownership)
            .map_err(|e| e.to_string())
    }

    /// `mesh` fits this plan: one size per axis of the plan's mesh.
    pub fn check_mesh(&self, mesh: Mesh) -> Result<(), ResolveError> {
        if mesh.ndim() != self.mesh.axes().len() {
            return Err(ResolveError::Mesh {
                mesh,
                axes: self.mesh.axes().to_vec(),
            });
        }
        Ok(())
    }

    /// The layout of every semantic that is not owner-partitioned: padded lengths.
    fn unowned_layout(
        &self,
        mesh: Mesh,
        sizes: &BTreeMap<String, usize>,
    ) -> Result<SampleLayout, ResolveError> {
        self.check_mesh(mesh)?;
        let mut layout = SampleLayout {
            mesh,
            sizes: sizes.clone(),
            padded: BTreeMap::new(),
            positions: BTreeMap::new(),
            blocks: BTreeMap::new(),
        };
        for (name, s) in &self.semantics {
            let Some(&len) = sizes.get(name) else {
                continue;
            };
            if !matches!(s.padding, Padding::OwnerBlocks { .. }) {
                layout
                    .padded
                    .insert(name.clone(), self.padded_length(name, len, mesh));
            }
        }
        Ok(layout)
    }

    fn layout_from_roots(
        &self,
        mesh: Mesh,
        sizes: &BTreeMap<String, usize>,
        roots: BTreeMap<String, Vec<usize>>,
    ) -> Result<SampleLayout, ResolveError> {
        let mut layout = self.unowned_layout(mesh, sizes)?;
        for (name, of_items) in roots {
            let Some(Padding::OwnerBlocks { root, .. }) =
                self.semantics.get(&name).map(|s| &s.padding)
            else {
                continue;
            };
            let root_padded =
                *layout
                    .padded
                    .get(root)
                    .ok_or_else(|| ResolveError::MissingOwnerLength {
                        semantic: name.to_string(),
                        owner: root.clone(),
                    })?;
            let blocks = self.pad_multiple(&name, mesh);
            let item_blocks: Vec<usize> = of_items
                .iter()
                .map(|&o| owner_block(o, root_padded, blocks))
                .collect();
            let l = BlockLayout::from_item_blocks(&item_blocks, blocks);
            layout
                .positions
                .insert(name.clone(), l.positions(&item_blocks));
            layout.padded.insert(name.clone(), l.padded());
            layout.blocks.insert(name, l);
        }
        Ok(layout)
    }
}

impl Plan {
    /// The part of tensor feature `t`'s global shape `global` that the rank at mesh
    /// coordinate `coord` of `mesh` holds, `(start, len)` per axis: on an uneven
    /// (domain) axis its `torch.chunk` piece, on another split axis its equal block, on
    /// a whole axis all of it. `None` when `coord` is off the mesh or an uneven axis
    /// would leave a shard empty.
    pub fn domain_window(
        &self,
        t: &TensorPlan,
        global: &[usize],
        mesh: Mesh,
        coord: Coord,
    ) -> Option<Vec<(usize, usize)>> {
        if coord.as_slice().len() != mesh.ndim()
            || coord
                .as_slice()
                .iter()
                .zip(mesh.sizes())
                .any(|(&c, &n)| c >= n)
        {
            return None;
        }
        let window = |m: usize, n: usize| {
            let (ranks, at) = (mesh.size(m), coord.get(m));
            if self.mesh.uneven(m) {
                let pieces = chunk_sizes(n, ranks)?;
                return Some((pieces[..at].iter().sum(), pieces[at]));
            }
            Some((at * (n / ranks), n / ranks))
        };
        t.axes
            .iter()
            .zip(global)
            .map(|(a, &n)| match a.split.mesh_axis() {
                Some(m) => window(m, n),
                None => Some((0, n)),
            })
            .collect()
    }

    /// ShardTensor's layout of tensor feature `t` (global shape `global`) as the rank at
    /// `coord` sees it: for each mesh axis that splits it, the local shapes of the
    /// ranks along that axis that share this rank's other coordinates, in order. `None`
    /// as for [`Plan::domain_window`].
    pub fn sharding_shapes(
        &self,
        t: &TensorPlan,
        global: &[usize],
        mesh: Mesh,
        coord: Coord,
    ) -> Option<BTreeMap<usize, Vec<Vec<usize>>>> {
        let mut out = BTreeMap::new();
        let split: BTreeSet<usize> = t.axes.iter().filter_map(|a| a.split.mesh_axis()).collect();
        for m in split {
            let along = (0..mesh.size(m)).map(|k| {
                let mut at = coord.as_slice().to_vec();
                *at.get_mut(m)? = k;
                let window = self.domain_window(t, global, mesh, mesh.coord_at(&at).ok()?)?;
                Some(window.into_iter().map(|(_, n)| n).collect())
            });
            out.insert(m, along.collect::<Option<Vec<Vec<usize>>>>()?);
        }
        Some(out)
    }

    /// The real shape of a padded tensor of `shape` whose axes have the semantics
    /// `axes` (`None` for a channel axis): each axis of a semantic `lengths` gives cut
    /// back to that length, any other axis whole. `Err` saying what does not match: an
    /// axis count other than the shape's, a semantic the spec does not declare, a
    /// length past the axis.
    pub fn real_shape(
        &self,
        axes: &[Option<String>],
        shape: &[usize],
        lengths: &BTreeMap<String, usize>,
    ) -> Result<Vec<usize>, String> {
        if axes.len() != shape.len() {
            return Err(format!("{} axis semantics for shape {shape:?}", axes.len()));
        }
        let real = |(d, (s, &n)): (usize, (&Option<String>, &usize))| match s {
            Some(s) if !self.semantics.contains_key(s) => {
                Err(format!("axis {d}: semantic `{s}` is not declared"))
            }
            Some(s) => match lengths.get(s) {
                Some(&len) if len > n => Err(format!(
                    "axis {d}: `{s}` has {len} items, more than the {n} the axis holds"
                )),
                Some(&len) => Ok(len),
                None => Ok(n),
            },
            None => Ok(n),
        };
        axes.iter().zip(shape).enumerate().map(real).collect()
    }
}

/// Owner counts of `semantic` must give one count per `owner` item and sum to its
/// `len` items.
fn check_counts(
    semantic: &str,
    owner: &str,
    counts: &[usize],
    owner_len: usize,
    len: usize,
) -> Result<(), ResolveError> {
    if counts.len() != owner_len {
        return Err(ResolveError::CountsLength {
            semantic: semantic.to_owned(),
            owner: owner.to_owned(),
            expected: owner_len,
            got: counts.len(),
        });
    }
    match crate::layout::checked_sum(counts.iter().copied()) {
        Some(sum) if sum == len => {}
        sum => {
            return Err(ResolveError::CountsSum {
                semantic: semantic.to_owned(),
                expected: len,
                got: sum,
            })
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::mesh::Mesh;

    fn plan(mesh: &str, tokens: &str) -> super::Plan {
        let spec = format!(
            "version: 1\nmodule: t\nmesh: {{cp: {mesh}}}\nsemantics:\n  tokens: {tokens}\n\
             features:\n  x: {{axes: [tokens], dtype: float32}}\n"
        );
        crate::compile_str("t.yaml", &spec).expect("spec").1
    }

    /// A window on a semantic that owns nothing and is owned by nothing pads it to a
    /// multiple of lcm(window, cp) on one CP axis, as docs/spec.md says (7 tokens of
    /// window 4 on cp 3: 12, not 9); a tile's blocks are the mesh's alone.
    #[test]
    fn a_window_pads_a_semantic_of_its_own_on_one_axis() {
        let windowed = plan("[cp]", "{shard: true, window: 4}");
        assert_eq!(
            windowed.padded_length("tokens", 7, Mesh::new(&[3]).unwrap()),
            12
        );
        assert_eq!(
            windowed.padded_length("tokens", 13, Mesh::new(&[2]).unwrap()),
            16
        );
        let plain = plan("[cp]", "{shard: true}");
        assert_eq!(
            plain.padded_length("tokens", 7, Mesh::new(&[3]).unwrap()),
            9
        );
        let tile = plan("[cp0, cp1]", "{shard: true, window: 4}");
        assert_eq!(
            tile.padded_length("tokens", 7, Mesh::new(&[3, 1]).unwrap()),
            9
        );
    }
}
