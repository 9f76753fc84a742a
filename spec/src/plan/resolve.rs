//! Resolving a plan for one sample on one mesh: padded lengths, layouts and shapes.

use std::collections::BTreeMap;
use std::fmt;

use super::*;
use crate::layout::{lcm_of, owner_block, round_up};

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

/// A plan evaluated for one mesh and one sample's lengths.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
pub struct Resolved {
    /// Mesh sizes `(cp0, cp1)`.
    pub mesh: [usize; CP_AXES],
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

/// Why a plan could not be resolved for a sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolveError {
    /// A mesh axis of size 0, or more ranks than the limit.
    BadMesh {
        /// The sizes given.
        mesh: Vec<usize>,
    },
    /// Mesh sizes of neither one nor two axes.
    MeshRank {
        /// The sizes given.
        mesh: Vec<usize>,
        /// The plan's mesh axes.
        axes: Vec<String>,
    },
    /// A mesh with more axes than the plan's domain mesh: a one-axis domain plan
    /// given a second axis larger than 1.
    MeshAxes {
        /// The sizes given.
        mesh: Vec<usize>,
        /// The plan's mesh axes.
        axes: Vec<String>,
    },
    /// No length for a semantic a feature's axis needs.
    MissingLength {
        /// The semantic without a length.
        semantic: String,
        /// The feature that needs it.
        feature: String,
        /// Its axis that counts the semantic.
        axis: usize,
    },
    /// No length for the owner (or the root owner) of a semantic that has one.
    MissingOwnerLength {
        /// The owned semantic.
        semantic: String,
        /// Its owner whose length is missing.
        owner: String,
    },
    /// Items of an owner-partitioned semantic whose root owner has none.
    NoOwners {
        /// The owned semantic.
        semantic: String,
        /// Its root owner.
        owner: String,
        /// Its items.
        len: usize,
    },
    /// No owner counts for an owner-partitioned semantic.
    MissingCounts {
        /// The owned semantic.
        semantic: String,
    },
    /// Owner counts of the wrong length (one per owner).
    CountsLength {
        /// The owned semantic.
        semantic: String,
        /// Its owner.
        owner: String,
        /// The owner's length.
        expected: usize,
        /// How many counts were given.
        got: usize,
    },
    /// Owner counts that do not sum to the semantic's length.
    CountsSum {
        /// The owned semantic.
        semantic: String,
        /// Its length.
        expected: usize,
        /// The counts' sum (`None`: past the largest length).
        got: Option<usize>,
    },
    /// A workflow the spec does not declare.
    UnknownWorkflow {
        /// The workflow named.
        workflow: String,
    },
    /// An item whose owner index is past the owner's length.
    OwnerOutOfRange {
        /// The owned semantic.
        semantic: String,
        /// Its owner.
        owner: String,
        /// The owner index given.
        index: usize,
        /// The owner's length.
        len: usize,
    },
    /// An uneven domain axis too short for its ranks: a shard would be empty.
    EmptyShard {
        /// The feature.
        feature: String,
        /// Its uneven axis.
        axis: usize,
        /// What the axis counts.
        semantic: String,
        /// The axis length.
        len: usize,
        /// The ranks of its mesh axis.
        ranks: usize,
        /// The mesh axis's name.
        mesh_axis: String,
    },
    /// An uneven domain axis whose shards break the semantic's stride or halo.
    ShardRule(Box<ShardBreach>),
}

impl fmt::Display for ResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResolveError::MeshAxes { mesh, axes } => write!(
                f,
                "mesh sizes {mesh:?}: the spec's mesh has {} axis {axes:?}; give one size per axis (e.g. --mesh {})",
                axes.len(),
                mesh[0]
            ),
            ResolveError::MeshRank { mesh, axes } => write!(
                f,
                "mesh sizes {mesh:?}: the spec's mesh is ({}), {} {} given; one size per axis ({})",
                axes.join(", "),
                mesh.len(),
                if mesh.len() == 1 { "axis" } else { "axes" },
                match (axes.len(), mesh.first()) {
                    (1, Some(a)) => format!("`{a}`"),
                    (_, Some(a)) => format!("`{a}x{}`", mesh.get(1).unwrap_or(a)),
                    _ => "`3x3`, or `8` on one axis".to_owned(),
                },
            ),
            ResolveError::BadMesh { mesh } => write!(f, "mesh sizes {mesh:?}: every CP mesh axis needs size at least 1, and the mesh at most {} ranks", crate::limits::MAX_RANKS),
            ResolveError::MissingLength { semantic, feature, axis } => write!(
                f,
                "feature `{feature}`, axis {axis} ({semantic}): no run-time length given for semantic `{semantic}`"
            ),
            ResolveError::MissingOwnerLength { semantic, owner } => write!(
                f,
                "semantic `{semantic}`: owned by `{owner}`, but no run-time length was given for `{owner}`"
            ),
            ResolveError::NoOwners { semantic, owner, len } => write!(
                f,
                "semantic `{semantic}`: {len} items, but `{owner}` has length 0: no owner to hold them (lengths that contradict each other)"
            ),
            ResolveError::MissingCounts { semantic } => write!(
                f,
                "semantic `{semantic}`: owner-partitioned, but no per-owner counts were given"
            ),
            ResolveError::CountsLength { semantic, owner, expected, got } => write!(
                f,
                "semantic `{semantic}`: {got} owner counts given, but `{owner}` has length {expected}"
            ),
            ResolveError::CountsSum { semantic, expected, got: Some(got) } => write!(
                f,
                "semantic `{semantic}`: owner counts sum to {got}, but its length is {expected}"
            ),
            ResolveError::CountsSum { semantic, expected, got: None } => write!(
                f,
                "semantic `{semantic}`: owner counts sum past the largest length (they overflow 64 bits), but its length is {expected}"
            ),
            ResolveError::UnknownWorkflow { workflow } => write!(f, "workflow `{workflow}` is not declared"),
            ResolveError::OwnerOutOfRange { semantic, owner, index, len } => write!(
                f,
                "semantic `{semantic}`: an item is owned by `{owner}` {index}, but `{owner}` has length {len}"
            ),
            ResolveError::EmptyShard { feature, axis, semantic, len, ranks, mesh_axis } => write!(
                f,
                "feature `{feature}`, axis {axis} ({semantic}): {len} items over {ranks} ranks would leave a shard empty on mesh axis `{mesh_axis}`"
            ),
            ResolveError::ShardRule(b) => {
                let ShardBreach { feature, axis, semantic, len, ranks, mesh_axis, sizes, stride, halo } = &**b;
                write!(
                f,
                "feature `{feature}`, axis {axis} ({semantic}): {len} items over {ranks} ranks of mesh axis `{mesh_axis}` \
                 give shards {sizes:?}, but `{semantic}` needs every shard {}; no uneven layout exists: \
                 pad the axis (drop `{mesh_axis}` from `uneven`) or change the length or the mesh",
                shard_needs(*stride, *halo)
            )
            }
        }
    }
}

/// `a multiple of 2 and at least 3 long`: what a semantic's shards must be.
fn shard_needs(stride: u32, halo: u32) -> String {
    let mut needs = Vec::new();
    if stride > 1 {
        needs.push(format!("a multiple of {stride}"));
    }
    if halo > 0 {
        needs.push(format!("at least {halo} long"));
    }
    needs.join(" and ")
}

/// The `torch.chunk` pieces of an uneven axis that break its semantic's stride or halo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardBreach {
    /// The feature.
    pub feature: String,
    /// Its uneven axis.
    pub axis: usize,
    /// What the axis counts.
    pub semantic: String,
    /// The axis length.
    pub len: usize,
    /// The ranks of its mesh axis.
    pub ranks: usize,
    /// The mesh axis's name.
    pub mesh_axis: String,
    /// The `torch.chunk` piece sizes.
    pub sizes: Vec<usize>,
    /// The semantic's stride (1 when not declared).
    pub stride: u32,
    /// The semantic's halo (0 when not declared).
    pub halo: u32,
}

impl std::error::Error for ResolveError {}

impl Plan {
    /// The padding multiple of a semantic on this mesh (1 when never padded): the lcm
    /// of the sizes of the mesh axes that split it, times its stride.
    pub fn pad_multiple(&self, semantic: &str, mesh: [usize; CP_AXES]) -> usize {
        let Some(s) = self.semantics.get(semantic) else {
            return 1;
        };
        match &s.padding {
            Padding::Multiple { mesh_axes, window } => {
                let window = window.map_or(1, |w| w as usize);
                lcm_of(mesh_axes.iter().map(|&m| mesh[m]).chain([window]))
                    * s.stride.max(1) as usize
            }
            Padding::OwnerBlocks { mesh_axes, .. } => lcm_of(mesh_axes.iter().map(|&m| mesh[m])),
            Padding::None => 1,
        }
    }

    /// The `torch.chunk` pieces of an uneven axis must meet its semantic's stride and
    /// halo: nothing can be padded to make them.
    fn check_shard_rule(
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
    pub fn padded_length(&self, semantic: &str, len: usize, mesh: [usize; CP_AXES]) -> usize {
        let halo_min = match self.semantics.get(semantic) {
            Some(SemanticPlan {
                padding: Padding::Multiple { mesh_axes, .. },
                halo,
                ..
            }) => {
                let most = mesh_axes.iter().map(|&m| mesh[m]).max().unwrap_or(1);
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
        mesh: [usize; CP_AXES],
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
        mesh: [usize; CP_AXES],
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

    /// The sizes of a mesh given with one size per axis of the plan's mesh (one or
    /// two) as the two axes every geometry function takes (a missing second axis has
    /// size 1), checked by [`Plan::check_mesh`]. A count that is not the plan's is
    /// refused by name: `3` is no `(cp0, cp1)` mesh, and `2x2` no `(cp,)` mesh.
    pub fn mesh_sizes(&self, sizes: &[usize]) -> Result<[usize; CP_AXES], ResolveError> {
        let axes = self.mesh.axes();
        let mesh = crate::layout::two_axes(sizes, 1)
            .filter(|_| sizes.len() == axes.len())
            .ok_or_else(|| ResolveError::MeshRank {
                mesh: sizes.to_vec(),
                axes: axes.to_vec(),
            })?;
        self.check_mesh(mesh)?;
        Ok(mesh)
    }

    /// [`Plan::layout`] of arguments from outside (the Python package's): `Err` naming
    /// the argument unless every length in `sizes` is a semantic of the plan within the
    /// limits and `mesh` fits ([`Plan::mesh_sizes`]).
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
        let mesh = self.mesh_sizes(mesh).map_err(|e| e.to_string())?;
        self.layout(mesh, sizes, ownership)
            .map_err(|e| e.to_string())
    }

    /// `mesh` fits this plan: every axis at least 1, at most the limit of ranks, and
    /// no second axis past 1 for a one-axis domain mesh.
    pub fn check_mesh(&self, mesh: [usize; CP_AXES]) -> Result<(), ResolveError> {
        if crate::limits::check_mesh(&mesh).is_err() {
            return Err(ResolveError::BadMesh {
                mesh: mesh.to_vec(),
            });
        }
        let axes = self.mesh.axes();
        if axes.len() == 1 && mesh[1] != 1 {
            return Err(ResolveError::MeshAxes {
                mesh: mesh.to_vec(),
                axes: axes.to_vec(),
            });
        }
        Ok(())
    }

    /// The layout of every semantic that is not owner-partitioned: padded lengths.
    fn unowned_layout(
        &self,
        mesh: [usize; CP_AXES],
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
        mesh: [usize; CP_AXES],
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
                        let ranks = mesh[mesh_axis];
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
                    Split::Mesh { mesh_axis } => (full, full / mesh[mesh_axis]),
                    Split::Follows { mesh_axis, .. } => {
                        let block = full / mesh[mesh_axis];
                        (block, block)
                    }
                };
                shapes.serial_shape.push(serial);
                shapes.padded_shape.push(full);
                shapes.global_shape.push(global);
                shapes.local_shape.push(local);
            }
            features.insert(name.to_owned(), shapes);
        }
        Ok(features)
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
        mesh: [usize; CP_AXES],
        coord: [usize; CP_AXES],
    ) -> Option<Vec<(usize, usize)>> {
        if coord.iter().zip(mesh).any(|(&c, n)| c >= n) {
            return None;
        }
        let window = |m: usize, n: usize| {
            let (ranks, at) = (*mesh.get(m)?, *coord.get(m)?);
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

/// Who owns each item of an owner-partitioned semantic, as a sample gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Items per direct owner, in owner order (from a `counts` feature).
    Counts(Vec<usize>),
    /// The direct owner of every item (from a one-hot `map` feature).
    Owners(Vec<usize>),
}

/// One sample laid out on one mesh.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SampleLayout {
    /// Mesh sizes `(cp0, cp1)`.
    pub mesh: [usize; CP_AXES],
    /// Serial length of every semantic present.
    pub sizes: BTreeMap<String, usize>,
    /// Padded length of every semantic present.
    pub padded: BTreeMap<String, usize>,
    /// Owner-partitioned semantics: the padded position of every item, in serial order.
    pub positions: BTreeMap<String, Vec<usize>>,
    /// Block layout of every owner-partitioned semantic.
    pub blocks: BTreeMap<String, BlockLayout>,
}

impl SampleLayout {
    /// Where the shard of `semantic` along `mesh_axis` at CP coordinate `coord` starts
    /// in its padded layout (what a shard-local id is counted from); `None` when the
    /// layout has no length for it.
    pub fn shard_start(
        &self,
        semantic: &str,
        mesh_axis: usize,
        coord: [usize; CP_AXES],
    ) -> Option<usize> {
        let padded = *self.padded.get(semantic)?;
        Some(coord[mesh_axis] * (padded / self.mesh[mesh_axis].max(1)))
    }

    /// The shard along `mesh_axis` that holds padded position `position` of `semantic`;
    /// `None` when the layout has no length for it.
    pub fn shard_of(&self, semantic: &str, mesh_axis: usize, position: usize) -> Option<usize> {
        let padded = *self.padded.get(semantic)?;
        let block = padded / self.mesh.get(mesh_axis).copied().unwrap_or(1).max(1);
        Some(position / block.max(1))
    }
}
