//! Why a plan cannot be resolved for a sample on a mesh.

use std::fmt;

use crate::mesh::Mesh;

/// Why a plan could not be resolved for a sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolveError {
    /// A mesh that is not the plan's: another count of axes.
    Mesh {
        /// The mesh given.
        mesh: Mesh,
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
            ResolveError::Mesh { mesh, axes } => write!(
                f,
                "mesh {mesh} has {} axes; the spec's mesh is ({}): give one size per axis",
                mesh.ndim(),
                axes.join(", ")
            ),
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
