//! What the fuzz targets share: the example spec's plan, compiled once per process.

use std::sync::OnceLock;

use featshard::spec::plan::Plan;

/// The plan of `examples/boltz2.yaml`, compiled on first use.
pub fn boltz2_plan() -> &'static Plan {
    static PLAN: OnceLock<Plan> = OnceLock::new();
    PLAN.get_or_init(|| {
        let text = include_str!("../../examples/boltz2.yaml");
        featshard::spec::compile_str("boltz2.yaml", text)
            .expect("example")
            .1
    })
}
