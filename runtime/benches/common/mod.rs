//! The Boltz-2-sized sample the runtime benchmarks share.

#![allow(dead_code)]

use std::path::PathBuf;

use featshard_runtime::synthetic::{self, Shape};
use featshard_runtime::Features;
use featshard_spec::plan::Plan;

pub const TOKENS: usize = 2048;
pub const MSA: usize = 4096;

pub fn boltz2_plan() -> Plan {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/boltz2.yaml");
    featshard_spec::compile_file(&path).expect("example spec").1
}

/// Atoms per token: ~20k atoms, unevenly spread (0..19 per token), some zero-atom tokens.
pub fn atom_counts() -> Vec<usize> {
    (0..TOKENS).map(|t| (t * 7919 + 13) % 20).collect()
}

/// An inference sample of `TOKENS` tokens and `MSA` MSA rows.
pub fn boltz2_sample(plan: &Plan) -> Features {
    let shape = Shape::boltz(atom_counts(), MSA, Some(TOKENS / 2))
        .with("ensemble", 1)
        .with("templates", 4);
    synthetic::sample(plan, Some("inference"), &shape, 1).expect("sample")
}
