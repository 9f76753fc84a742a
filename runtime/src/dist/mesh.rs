//! The device mesh `(dp, cp0, cp1)`: row-major global ranks and this rank's groups.

use featshard_spec::layout::coords;
use featshard_spec::plan::{Plan, CP_AXES};
use featshard_spec::replicas::{mesh_position, mesh_rank};

use super::error::DistError;
use super::group::{ProcessGroup, Rendezvous};

/// This rank's place on the mesh and a process group along each of its axes.
///
/// Global rank `r = d * cp0 * cp1 + i * cp1 + j` sits at `(d, i, j)`. The CP group of a
/// replica is its `cp0 * cp1` ranks (group rank `i * cp1 + j`, the runtime's block
/// order); its source is CP coordinate `(0, 0)`.
#[derive(Debug)]
pub struct Mesh {
    dp: usize,
    cp: [usize; CP_AXES],
    rank: usize,
    world: ProcessGroup,
    cp_group: ProcessGroup,
    dp_group: ProcessGroup,
    axes: [ProcessGroup; CP_AXES],
}

impl Mesh {
    /// Creates the groups of this rank; every rank of the world must call it with the
    /// same shape.
    pub fn new(rdv: &Rendezvous, dp: usize, cp: [usize; CP_AXES]) -> Result<Mesh, DistError> {
        let product = dp * cp[0] * cp[1];
        if product == 0 || product != rdv.world_size() {
            return Err(DistError::Setup {
                message: format!(
                    "mesh dp={dp} x cp=({}, {}) holds {product} ranks, but the world has {}",
                    cp[0],
                    cp[1],
                    rdv.world_size()
                ),
            });
        }
        let rank = rdv.rank();
        let cp_size = cp[0] * cp[1];
        let (d, [i, j]) = mesh_position(rank, cp);
        let at = |d: usize, i: usize, j: usize| mesh_rank(d, [i, j], cp);
        let world = rdv.world()?;
        // Every rank creates its groups in the same order (cp, dp, cp0, cp1).
        let member = |g: Result<Option<ProcessGroup>, DistError>, what: &str| {
            g?.ok_or_else(|| DistError::Setup {
                message: format!("rank {rank} is not in its own {what} group"),
            })
        };
        let cp_ranks: Vec<usize> = (0..cp_size)
            .map(|k| mesh_rank(d, coords(cp, k), cp))
            .collect();
        let cp_group = member(rdv.group(&format!("cp.{d}"), &cp_ranks), "cp")?;
        let dp_ranks: Vec<usize> = (0..dp).map(|e| at(e, i, j)).collect();
        let dp_group = member(rdv.group(&format!("dp.{i}.{j}"), &dp_ranks), "dp")?;
        let cp0_ranks: Vec<usize> = (0..cp[0]).map(|k| at(d, k, j)).collect();
        let cp0 = member(rdv.group(&format!("cp0.{d}.{j}"), &cp0_ranks), "cp0")?;
        let cp1_ranks: Vec<usize> = (0..cp[1]).map(|k| at(d, i, k)).collect();
        let cp1 = member(rdv.group(&format!("cp1.{d}.{i}"), &cp1_ranks), "cp1")?;
        Ok(Mesh {
            dp,
            cp,
            rank,
            world,
            cp_group,
            dp_group,
            axes: [cp0, cp1],
        })
    }

    /// Parses a mesh shape for `plan`'s mesh: one size per CP axis (`3x3` on
    /// `(cp0, cp1)`, `8` on `(cp,)`; dp = 1), or the DP size in front (`2x2x2`, `2x3`).
    /// Any other count is refused by name, never read as another mesh.
    pub fn parse_shape(s: &str, plan: &Plan) -> Result<(usize, [usize; CP_AXES]), DistError> {
        let bad = |why: String| DistError::Setup {
            message: format!("mesh `{s}`: {why}"),
        };
        let sizes: Vec<usize> = s
            .split('x')
            .map(|p| p.trim().parse::<usize>().ok().filter(|&n| n > 0))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("sizes must be positive integers, e.g. 3x3, 2x2x2 or 8".into()))?;
        let axes = plan.mesh.axes().len();
        let (dp, cp) = match sizes.len() {
            n if n == axes => (1, &sizes[..]),
            n if n == axes + 1 => (sizes[0], &sizes[1..]),
            n => {
                return Err(bad(format!(
                "{n} sizes for the spec's mesh ({}): one per axis, the DP size optionally in front",
                plan.mesh.axes().join(", ")
            )))
            }
        };
        let cp = plan.mesh_sizes(cp).map_err(|e| bad(e.to_string()))?;
        Ok((dp, cp))
    }

    /// How many data-parallel replicas.
    pub fn dp_size(&self) -> usize {
        self.dp
    }

    /// The CP mesh `(cp0, cp1)`.
    pub fn cp_shape(&self) -> [usize; CP_AXES] {
        self.cp
    }

    /// This rank in the world.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// This rank's data-parallel replica.
    pub fn dp_index(&self) -> usize {
        mesh_position(self.rank, self.cp).0
    }

    /// This rank's coordinate on the CP mesh.
    pub fn cp_coord(&self) -> [usize; CP_AXES] {
        mesh_position(self.rank, self.cp).1
    }

    /// Rank within the CP group (`i * cp1 + j`).
    pub fn cp_rank(&self) -> usize {
        self.cp_group.rank()
    }

    /// Whether this rank loads and plans the samples of its CP group.
    pub fn is_source(&self) -> bool {
        self.cp_rank() == 0
    }

    /// The group of every rank.
    pub fn world(&self) -> &ProcessGroup {
        &self.world
    }

    /// This rank's CP group (one sample's ranks).
    pub fn cp(&self) -> &ProcessGroup {
        &self.cp_group
    }

    /// This rank's DP group (the ranks at its CP coordinate in every replica).
    pub fn dp(&self) -> &ProcessGroup {
        &self.dp_group
    }

    /// The group along CP mesh axis `m` (0 or 1) through this rank.
    pub fn cp_axis(&self, m: usize) -> Option<&ProcessGroup> {
        self.axes.get(m)
    }
}
