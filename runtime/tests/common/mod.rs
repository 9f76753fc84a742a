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
    let with_atoms = counts.iter().filter(|&&c| c > 0).count();
    let shape = Shape {
        sizes: [
            ("tokens", counts.len()),
            ("msa", 5),
            ("ensemble", 2),
            ("disto_ensemble", 1),
            ("templates", 2),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        counts: [(
            "atoms".to_owned(),
            counts.iter().map(|&c| c as usize).collect(),
        )]
        .into(),
        mapped: [("rset".to_owned(), with_atoms.div_ceil(2))].into(),
    };
    synthetic::sample(plan, Some("inference"), &shape, seed).expect("synthetic sample")
}
