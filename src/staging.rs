//! Where featshard writes before an output is in place: a staging folder or file of
//! its own next to the output, created exclusively (a name planted there, link or not,
//! is never written through), renamed over the output at the end, and removed on
//! failure and, in the command-line program, on SIGINT, SIGTERM and SIGHUP. Nothing
//! here removes what featshard did not write.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::commands::Failure;

/// Staging paths alive now, removed by [`cleanup_on_signals`]' handler.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Creates a staging path with `make` and registers it, the registry locked
/// throughout: a signal handled meanwhile waits, then finds the path registered.
fn registered<T>(
    make: impl FnOnce() -> std::io::Result<T>,
    path_of: impl Fn(&T) -> PathBuf,
) -> std::io::Result<T> {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    let made = make()?;
    live.push(path_of(&made));
    Ok(made)
}

fn unregister(path: &Path) {
    if let Ok(mut live) = LIVE.lock() {
        live.retain(|p| p != path);
    }
}

/// In the command-line program: on SIGINT, SIGTERM or SIGHUP, every live staging path
/// is removed before the process exits with 128 + the signal's number. Not called by
/// the in-process CLI of the Python package, whose interpreter owns its signals.
pub fn cleanup_on_signals() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        return;
    };
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            // Held to the exit: no staging path is made or let go meanwhile.
            let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            for path in live.iter() {
                // Writers may still add files while a folder goes: a few tries.
                for _ in 0..10 {
                    if remove_own(path).is_ok() {
                        break;
                    }
                }
            }
            std::process::exit(128 + sig);
        }
    });
}

/// Removes a staging path: a folder (never followed if a link) or a file.
fn remove_own(path: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn parent_of(out: &Path) -> &Path {
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// `out`'s folder, its missing folders created (as `generate` creates its `--out`); an
/// error naming the folder that could not be.
fn made_parent(out: &Path) -> Result<&Path, Failure> {
    let parent = parent_of(out);
    std::fs::create_dir_all(parent).map_err(|e| {
        Failure::Other(format!(
            "cannot create the folder {} for {}: {e}",
            parent.display(),
            out.display()
        ))
    })?;
    Ok(parent)
}

/// `.<name>.tmp-`: the prefix of every staging name of `out`.
fn prefix(out: &Path) -> String {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    format!(".{name}.tmp-")
}

/// `.<name>.tmp-<pid>.`: this process's staging names of `out` start so; a random
/// tail follows.
fn own_prefix(out: &Path) -> String {
    format!("{}{}.", prefix(out), std::process::id())
}

/// An existing `out` must be a folder (`want_dir`) or a regular file, and not a link;
/// an absent one is fine.
pub fn check_existing(out: &Path, want_dir: bool) -> Result<(), Failure> {
    let Ok(m) = fs::symlink_metadata(out) else {
        return Ok(());
    };
    let what = if m.file_type().is_symlink() {
        Some("a symbolic link")
    } else if want_dir && !m.is_dir() {
        Some("not a folder")
    } else if !want_dir && !m.is_file() {
        Some("not a regular file (a device, FIFO, socket or folder)")
    } else {
        None
    };
    match what {
        Some(what) => Err(Failure::Other(format!(
            "{} exists and is {what}: featshard replaces only what it writes; choose another --out",
            out.display()
        ))),
        None => Ok(()),
    }
}

/// A staging folder for `out`, created new (never an existing name or link).
pub struct StagingDir {
    path: PathBuf,
    done: bool,
}

impl StagingDir {
    /// Creates `.<out>.tmp-<pid>.<random>` next to `out`, after removing the staging
    /// folders of runs into `out` whose process is gone.
    pub fn create(out: &Path) -> Result<StagingDir, Failure> {
        let parent = made_parent(out)?;
        remove_stale(out);
        let make = || {
            tempfile::Builder::new()
                .prefix(&own_prefix(out))
                .tempdir_in(parent)
                .map(tempfile::TempDir::keep)
        };
        let path = registered(make, PathBuf::clone).map_err(|e| {
            Failure::Other(format!(
                "cannot create a staging folder in {}: {e}",
                parent.display()
            ))
        })?;
        Ok(StagingDir { path, done: false })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the folder to `out` (absent, or an empty folder that is not a link).
    pub fn finish(mut self, out: &Path) -> Result<(), Failure> {
        check_existing(out, true)?;
        if out.exists() {
            fs::remove_dir(out).map_err(|e| {
                Failure::Other(format!(
                    "{}: {e} (another run wrote it first?)",
                    out.display()
                ))
            })?;
        }
        fs::rename(&self.path, out).map_err(|e| {
            Failure::Other(format!("cannot move shards into {}: {e}", out.display()))
        })?;
        unregister(&self.path);
        self.done = true;
        Ok(())
    }
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        if !self.done {
            let _ = remove_own(&self.path);
            unregister(&self.path);
        }
    }
}

/// Writes `bytes` to `out` through a staging file created exclusively next to it, then
/// renamed over it: `out` is replaced whole or not at all, and only when it is absent
/// or a regular file (never a device node, FIFO, folder or link).
pub fn write_file(out: &Path, bytes: &[u8]) -> Result<(), Failure> {
    check_existing(out, false)?;
    let parent = made_parent(out)?;
    let cannot =
        |e: &dyn std::fmt::Display| Failure::Other(format!("cannot write {}: {e}", out.display()));
    let make = || {
        tempfile::Builder::new()
            .prefix(&own_prefix(out))
            .tempfile_in(parent)
    };
    let mut tmp = registered(make, |t| t.path().to_owned()).map_err(|e| cannot(&e))?;
    let written = tmp
        .as_file_mut()
        .write_all(bytes)
        .and_then(|()| tmp.as_file().sync_data());
    let path = tmp.path().to_owned();
    let result = written
        .map_err(|e| cannot(&e))
        .and_then(|()| tmp.persist(out).map(drop).map_err(|e| cannot(&e.error)));
    unregister(&path);
    result
}

/// Removes staging folders of earlier runs into `out` whose process is gone (killed
/// mid-run): on Linux, a pid without `/proc/<pid>`. A live run's folder, this run's,
/// and anything that is not a folder (a link planted there) are left alone.
fn remove_stale(out: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let prefix = prefix(out);
    let Ok(entries) = fs::read_dir(parent_of(out)) else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = staging_pid(&e.file_name(), &prefix) else {
            continue;
        };
        let own = pid == std::process::id();
        let alive = Path::new("/proc").join(pid.to_string()).exists();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if !own && !alive && is_dir {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The pid in a staging name `<prefix><pid>` or `<prefix><pid>.<random>`.
fn staging_pid(name: &OsString, prefix: &str) -> Option<u32> {
    let tail = name.to_str()?.strip_prefix(prefix)?;
    tail.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staging_name_gives_its_pid() {
        let p = ".out.tmp-";
        assert_eq!(staging_pid(&".out.tmp-42.Xy1".into(), p), Some(42));
        assert_eq!(staging_pid(&".out.tmp-42".into(), p), Some(42));
        assert_eq!(staging_pid(&".out.tmp-x.1".into(), p), None);
        assert_eq!(staging_pid(&".other.tmp-42".into(), p), None);
    }

    #[test]
    fn a_planted_link_at_a_staging_name_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::create_dir(&target).unwrap();
        let out = dir.path().join("shards");
        // A link at this process's staging name of old (`.<out>.tmp-<pid>`).
        let planted = dir
            .path()
            .join(format!(".shards.tmp-{}", std::process::id()));
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        let staging = StagingDir::create(&out).unwrap();
        assert!(fs::symlink_metadata(staging.path()).unwrap().is_dir());
        fs::write(staging.path().join("f"), b"x").unwrap();
        staging.finish(&out).unwrap();
        assert!(fs::read_dir(&target).unwrap().next().is_none());
        assert!(fs::symlink_metadata(&out).unwrap().is_dir());
        assert!(fs::symlink_metadata(&planted)
            .unwrap()
            .file_type()
            .is_symlink());
    }
}
