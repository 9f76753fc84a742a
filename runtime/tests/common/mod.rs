//! Boltz-shaped serial samples for runtime tests.

#![allow(dead_code)]

use std::path::PathBuf;

use featshard_runtime::synthetic::{self, Shape};
use featshard_runtime::Features;
use featshard_spec::plan::Plan;

pub fn boltz2_plan() -> Plan {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/boltz2.yaml");
    featshard_spec::compile_file(&path)
        .unwrap_or_else(|d| panic!("{}", d.render_plain()))
        .1
}

/// A serial sample of the inference workflow with the given atoms per token; about
/// one R-set row per two tokens with atoms.
pub fn boltz_sample(plan: &Plan, counts: &[i64], seed: i64) -> Features {
    let shape = Shape::boltz(counts.iter().map(|&c| c as usize).collect(), 5, None);
    synthetic::sample(plan, Some("inference"), &shape, seed).expect("synthetic sample")
}

/// A CP mesh of `sizes` (one per axis), which tests give within the limits.
pub fn mesh(sizes: &[usize]) -> featshard_spec::Mesh {
    featshard_spec::Mesh::new(sizes).expect("a test mesh")
}

/// The coordinate `at` on `mesh`, which tests give on the mesh.
pub fn coord(mesh: featshard_spec::Mesh, at: &[usize]) -> featshard_spec::Coord {
    mesh.coord_at(at).expect("a test coordinate")
}
