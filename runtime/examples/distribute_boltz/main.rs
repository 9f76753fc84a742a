//! Distributes Boltz-shaped samples over a `(dp, cp0, cp1)` mesh through c10d (gloo)
//! and checks every rank's blocks. Start it with the standard launcher:
//!
//! ```text
//! torchrun --nproc-per-node 9 --no-python target/release/examples/distribute_boltz \
//!     --spec examples/boltz2.yaml --mesh 3x3
//! ```
//!
//! Each rank checks, for every sample: its received blocks equal the runtime's blocks
//! for its coordinate; the CP group's blocks, gathered and assembled, equal the serial
//! sample; sharded features are really split; pad positions are masked. A DP collate
//! of each sample follows. Failures can be injected (`--fail-*`, `--crash-*`) to see
//! every rank return the same error. Each rank prints one summary line.

use std::process::ExitCode;

use clap::Parser;

mod run;

fn main() -> ExitCode {
    tch::set_num_threads(1);
    run::main_with(&run::Args::parse())
}
