//! The command line as the integration tests run it: the built binary, from the
//! repository root, with no standard input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shipped Boltz-2 spec's path.
pub fn spec() -> String {
    root().join("examples/boltz2.yaml").display().to_string()
}

/// `featshard ARGS`, run to its end.
pub fn featshard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_featshard"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null())
        .output()
        .expect("run featshard")
}

/// `featshard shard` of `features` (a file, or a dataset argument) on `mesh` for the
/// inference workflow into `out`, not yet started.
pub fn shard_command(features: &str, mesh: &str, out: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_featshard"));
    cmd.args(["shard", &spec(), "--features", features])
        .args(["--mesh", mesh, "--workflow", "inference", "--out"])
        .arg(out)
        .current_dir(root())
        .stdin(Stdio::null());
    cmd
}

/// [`shard_command`] of one sample file, run to its end.
pub fn shard(features: &Path, mesh: &str, out: &Path) -> Output {
    shard_command(&features.display().to_string(), mesh, out)
        .output()
        .expect("run featshard")
}

/// [`shard`] with the rank files' encoding (`compact` or `dense`).
#[allow(dead_code)]
pub fn shard_encoded(features: &Path, mesh: &str, out: &Path, encoding: &str) -> Output {
    shard_command(&features.display().to_string(), mesh, out)
        .args(["--encoding", encoding])
        .output()
        .expect("run featshard")
}
