//! The device mesh `(dp, cp...)`: row-major global ranks and this rank's groups.

use featshard_spec::{Coord, DeviceMesh, Mesh as CpMesh};

use super::error::DistError;
use super::group::{ProcessGroup, Rendezvous};

/// This rank's place on the device mesh and a process group along each of its axes.
///
/// Global rank `r = d * cp.ranks() + cp.rank(coord)` sits at replica `d`, CP
/// coordinate `coord` ([`DeviceMesh::position`]). The CP group of a replica is its
/// `cp.ranks()` ranks (group rank `cp.rank(coord)`, the runtime's block order); its
/// source is the CP mesh's origin.
#[derive(Debug)]
pub struct Mesh {
    shape: DeviceMesh,
    rank: usize,
    world: ProcessGroup,
    cp_group: ProcessGroup,
    dp_group: ProcessGroup,
    /// One group per CP axis, in the mesh's order.
    axes: Vec<ProcessGroup>,
}

impl Mesh {
    /// Creates the groups of this rank; every rank of the world must call it with the
    /// same shape (parsed for a plan by [`featshard_spec::plan::MeshPlan::parse`]).
    pub fn new(rdv: &Rendezvous, shape: DeviceMesh) -> Result<Mesh, DistError> {
        if shape.world() != rdv.world_size() {
            return Err(DistError::Setup {
                message: format!(
                    "mesh dp={} x cp={} holds {} ranks, but the world has {}",
                    shape.dp,
                    shape.cp,
                    shape.world(),
                    rdv.world_size()
                ),
            });
        }
        let rank = rdv.rank();
        let (d, coord) = shape.position(rank);
        let world = rdv.world()?;
        // Every rank creates its groups in the same order (cp, dp, then each CP axis).
        let member = |g: Result<Option<ProcessGroup>, DistError>, what: &str| {
            g?.ok_or_else(|| DistError::Setup {
                message: format!("rank {rank} is not in its own {what} group"),
            })
        };
        let cp_ranks: Vec<usize> = shape.cp.coords().map(|c| shape.rank(d, c)).collect();
        let cp_group = member(rdv.group(&format!("cp.{d}"), &cp_ranks), "cp")?;
        let dp_ranks: Vec<usize> = (0..shape.dp).map(|e| shape.rank(e, coord)).collect();
        let dp_group = member(
            rdv.group(&format!("dp.{}", line(coord, None)), &dp_ranks),
            "dp",
        )?;
        let mut axes = Vec::with_capacity(shape.cp.ndim());
        for m in 0..shape.cp.ndim() {
            let along = along_axis(shape, d, coord, m);
            let key = format!("cp{m}.{d}.{}", line(coord, Some(m)));
            axes.push(member(rdv.group(&key, &along), &format!("cp axis {m}"))?);
        }
        Ok(Mesh {
            shape,
            rank,
            world,
            cp_group,
            dp_group,
            axes,
        })
    }

    /// How many data-parallel replicas.
    pub fn dp_size(&self) -> usize {
        self.shape.dp
    }

    /// The CP mesh: the axes one sample is split over.
    pub fn cp_shape(&self) -> CpMesh {
        self.shape.cp
    }

    /// The whole device mesh, DP and CP.
    pub fn shape(&self) -> DeviceMesh {
        self.shape
    }

    /// This rank in the world.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// This rank's data-parallel replica.
    pub fn dp_index(&self) -> usize {
        self.shape.position(self.rank).0
    }

    /// This rank's coordinate on the CP mesh.
    pub fn cp_coord(&self) -> Coord {
        self.shape.position(self.rank).1
    }

    /// Rank within the CP group (`cp.rank(coord)`).
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

    /// The group along CP mesh axis `m` through this rank (`None` past the mesh's axes).
    pub fn cp_axis(&self, m: usize) -> Option<&ProcessGroup> {
        self.axes.get(m)
    }
}

/// The global ranks of replica `d` along CP axis `m` through `coord`, in order.
fn along_axis(shape: DeviceMesh, d: usize, coord: Coord, m: usize) -> Vec<usize> {
    let mut at = coord.as_slice().to_vec();
    (0..shape.cp.size(m))
        .map(|k| {
            at[m] = k;
            let c = shape.cp.coord_at(&at).unwrap_or(coord);
            shape.rank(d, c)
        })
        .collect()
}

/// A group's key part for the line through `coord` along axis `m` (every index but
/// `m`'s, which is `*`), the same on every rank of the group.
fn line(coord: Coord, m: Option<usize>) -> String {
    let at = coord.as_slice().iter().enumerate();
    let parts: Vec<String> = at
        .map(|(k, i)| {
            if Some(k) == m {
                "*".into()
            } else {
                i.to_string()
            }
        })
        .collect();
    parts.join(".")
}
