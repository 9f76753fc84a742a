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

/// The shipped Boltz-2 spec on a one-axis CP mesh: its `mesh:` line changed to
/// `cp: [cp]` and nothing else (written once per test binary).
#[allow(dead_code)]
pub fn spec_1d() -> String {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let path = PATH.get_or_init(|| {
        let text = std::fs::read_to_string(root().join("examples/boltz2.yaml")).unwrap();
        assert!(text.contains("cp: [cp_axis_0, cp_axis_1]"));
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("boltz2_1d.yaml");
        std::fs::write(
            &path,
            text.replace("cp: [cp_axis_0, cp_axis_1]", "cp: [cp]"),
        )
        .unwrap();
        path
    });
    path.display().to_string()
}

/// The spec a mesh argument is for: `3x3` the shipped (cp0, cp1) one, `8` [`spec_1d`].
#[allow(dead_code)]
pub fn spec_for(mesh: &str) -> String {
    match mesh.contains('x') {
        true => spec(),
        false => spec_1d(),
    }
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

/// `featshard ARGS`, which must succeed (its stderr in the failure).
#[allow(dead_code)]
pub fn run(args: &[&str]) {
    let out = featshard(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `featshard shard` of `features` (a file, or a dataset argument) on `mesh` for the
/// inference workflow into `out`, not yet started.
pub fn shard_command(features: &str, mesh: &str, out: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_featshard"));
    cmd.args(["shard", &spec_for(mesh), "--features", features])
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

/// A child's output, or a failure when it runs past `secs` (a hang is a defect).
#[allow(dead_code)]
pub fn within(secs: u64, mut cmd: Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running after {secs} s: {cmd:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Sets the first stored byte of tensor `name` in the rank file at `path` to `value`
/// (its checksum left stale): a corrupt stored block.
#[allow(dead_code)]
pub fn corrupt_first_byte(path: &Path, name: &str, value: u8) {
    let mut bytes = std::fs::read(path).unwrap();
    let (n, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let (start, _) = header.info(name).unwrap().data_offsets;
    bytes[8 + n + start] = value;
    std::fs::write(path, &bytes).unwrap();
}
