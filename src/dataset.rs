//! `featshard shard` over a dataset: many sample files in one run, in parallel over
//! samples, one folder per sample, with progress, a dataset manifest, and resume.
//!
//! One folder per sample (`OUT/<sample>/rank-<r>.safetensors`) rather than one file per
//! rank holding every sample: a sample is then finished exactly when its folder is
//! renamed into place, a failed or killed sample leaves nothing half-written to resume
//! from, and a reader still opens only its own rank's file of each sample.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use featshard_exec::files::MAX_MAPPED;

use crate::commands::{load, Failure};
use crate::shards::{self, Request, Run};
use featshard_spec::shards::{DatasetManifest, SampleEntry, Status, DATASET_VERSION};

/// Whether `--features` names a dataset rather than one sample file: a folder, a list
/// file (`@FILE`, one path per line) or a glob pattern.
pub fn is_dataset(features: &str) -> bool {
    features.starts_with('@') || features.contains(['*', '?', '[']) || Path::new(features).is_dir()
}

/// The sample files a dataset argument names, sorted, each with its folder name.
pub fn samples(features: &str) -> Result<Vec<(String, PathBuf)>, Failure> {
    let bad = |e: String| Failure::Other(format!("--features {features}: {e}"));
    let paths: Vec<PathBuf> = if let Some(list) = features.strip_prefix('@') {
        let text = read_list(Path::new(list)).map_err(bad)?;
        let base = Path::new(list).parent().unwrap_or(Path::new("."));
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| base.join(l))
            .collect()
    } else if Path::new(features).is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(features)
            .map_err(|e| bad(e.to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        v.sort();
        v
    } else {
        glob_files(features).map_err(bad)?
    };
    if paths.is_empty() {
        return Err(bad("no sample files".into()));
    }
    // Names are written into dataset.json as UTF-8: any other is refused up front, by
    // name, before a sample is sharded.
    if let Some(p) = paths.iter().find(|p| p.to_str().is_none()) {
        return Err(bad(format!(
            "{}: a file name that is not UTF-8 (rename it)",
            p.to_string_lossy()
        )));
    }
    let mut named: BTreeMap<String, PathBuf> = BTreeMap::new();
    for p in paths {
        let name = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .filter(|s| !s.is_empty() && !s.starts_with('.'))
            .ok_or_else(|| bad(format!("{}: not a sample file name", p.display())))?;
        if let Some(first) = named.insert(name.clone(), p.clone()) {
            return Err(bad(format!(
                "{} and {} would both shard into `{name}`",
                first.display(),
                p.display()
            )));
        }
    }
    Ok(named.into_iter().collect())
}

/// Folders a glob pattern's walk descends at most below its fixed part.
const MAX_GLOB_DEPTH: usize = 64;

/// Entries a glob pattern's walk visits at most.
const MAX_GLOB_ENTRIES: usize = 10_000_000;

/// The files a glob pattern matches, sorted: a walk of the folder its fixed part names,
/// following links to folders but never into one of its own ancestors (a link cycle,
/// `self -> .` or `up -> ..`, is detected, not walked), and bounded in depth and in
/// entries visited (past the bound the pattern is refused, by name).
fn glob_files(pattern: &str) -> Result<Vec<PathBuf>, String> {
    let glob = globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| e.to_string())?
        .compile_matcher();
    let (base, depth) = glob_base(pattern);
    let implicit = !pattern.starts_with('.') && base == Path::new(".");
    let mut found = Vec::new();
    let walk = walkdir::WalkDir::new(&base)
        .follow_links(true)
        .max_depth(depth);
    for (visited, entry) in walk.into_iter().enumerate() {
        if visited >= MAX_GLOB_ENTRIES {
            return Err(format!(
                "the walk of {} passed {MAX_GLOB_ENTRIES} entries: name the samples' folder more narrowly",
                base.display()
            ));
        }
        // A cycle (an ancestor reached again through a link) or an unreadable entry is
        // not walked into; what it holds is not a sample this pattern names.
        let Ok(entry) = entry else { continue };
        // Matched as the pattern writes paths: `x` for `./x` when it names no folder.
        let path = match implicit {
            true => entry.path().strip_prefix(".").unwrap_or(entry.path()),
            false => entry.path(),
        };
        if entry.file_type().is_file() && glob.is_match(path) {
            found.push(path.to_path_buf());
        }
    }
    found.sort();
    Ok(found)
}

/// The leading folders of a glob pattern that hold no wildcard (`.` when none do), and
/// how deep below them its matches lie at most (its other components; any depth up to
/// [`MAX_GLOB_DEPTH`] with `**`).
fn glob_base(pattern: &str) -> (PathBuf, usize) {
    let wild = |c: &std::path::Component| {
        c.as_os_str()
            .to_string_lossy()
            .contains(['*', '?', '[', '{'])
    };
    let all: Vec<_> = Path::new(pattern).components().collect();
    let fixed: PathBuf = all.iter().take_while(|c| !wild(c)).collect();
    let depth = match pattern.contains("**") {
        true => MAX_GLOB_DEPTH,
        false => all.len() - all.iter().take_while(|c| !wild(c)).count(),
    };
    match fixed.as_os_str().is_empty() {
        true => (PathBuf::from("."), depth),
        false => (fixed, depth),
    }
}

/// Largest `@LIST` file read: a million paths of 64 characters.
const MAX_LIST_BYTES: u64 = 64 << 20;

/// An `@LIST` file's text: a regular file only (a FIFO is refused, never waited on),
/// and at most [`MAX_LIST_BYTES`] (`@/dev/zero` is refused, not read until memory ends).
fn read_list(path: &Path) -> Result<String, String> {
    let bytes =
        featshard_exec::files::read_bounded(path, MAX_LIST_BYTES).map_err(|e| e.to_string())?;
    String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", path.display()))
}

/// Shards every sample into `out/<name>/`, `jobs` samples at a time. A sample already
/// finished (its manifest reads and every rank file has the size and checksum it was
/// written with) is skipped; one that fails is reported by name while the others go
/// on. Writes `out/dataset.json`; fails (exit 1) at the end if any sample failed.
pub fn shard_dataset(
    spec: &Path,
    features: &str,
    run: &Run,
    out: &Path,
) -> Result<String, Failure> {
    let (_, plan) = load(spec)?;
    let list = samples(features)?;
    std::fs::create_dir_all(out)
        .map_err(|e| Failure::Other(format!("cannot create {}: {e}", out.display())))?;
    let bar = progress(list.len());
    let req = Request::new(&plan, run, false)?;
    let written = AtomicU64::new(0);
    let jobs = jobs_at_once(run, list.len());
    // Samples at a time on exec's one scheduler, each taken by whichever job is free.
    let mut entries = featshard_exec::par::map(
        &list,
        jobs,
        || (),
        |_, (name, source)| {
            let entry = one(&req, name, source, &out.join(name));
            let bytes = written.fetch_add(entry.bytes, Ordering::Relaxed) + entry.bytes;
            bar.inc(1);
            bar.set_message(format!("{} MB", bytes / 1_000_000));
            entry
        },
    );
    bar.finish_and_clear();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    write_manifest(&plan, req.mesh, run, out, &entries)?;
    summary(&entries, out)
}

/// Samples sharded at once: `--jobs`, bounded by what the process may hold: every job
/// keeps its sample mapped (at most [`MAX_MAPPED`] files are) and its rank files open
/// while they are written (a file per thread, besides the sample and the manifest). A
/// bound is said on stderr, and no sample fails for it.
fn jobs_at_once(run: &Run, samples: usize) -> usize {
    let wanted = run.jobs.clamp(1, samples.max(1));
    let per_job = run.threads.max(1) + 2;
    let files = open_files_allowed().saturating_sub(RESERVED_FILES) / per_job;
    let bound = MAX_MAPPED.min(files.max(1));
    if wanted > bound {
        eprintln!(
            "featshard: --jobs {}: {bound} samples at a time (each holds its sample mapped and {per_job} files open; this process may map {MAX_MAPPED} files and open {} at once)",
            run.jobs,
            open_files_allowed()
        );
    }
    wanted.min(bound)
}

/// Files a process keeps open besides its jobs' (its standard streams, libraries,
/// the output folder).
const RESERVED_FILES: usize = 64;

/// How many files this process may open: its soft limit raised to the hard one.
fn open_files_allowed() -> usize {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if setrlimit(Resource::Nofile, limit).is_err() {
            limit = getrlimit(Resource::Nofile);
        }
    }
    limit
        .current
        .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// One sample: skipped if finished and verified, else (re)sharded.
fn one(req: &Request, name: &str, source: &Path, target: &Path) -> SampleEntry {
    let entry = |status, bytes, error| SampleEntry {
        name: name.to_owned(),
        source: source.to_path_buf(),
        status,
        bytes,
        error,
    };
    if target.join("manifest.json").exists() {
        if let Ok(bytes) = shards::verify(req, source, target) {
            return entry(Status::Verified, bytes, None);
        }
    }
    // Corrupt, of another run, or not finished: redone from scratch, when the folder
    // holds only what featshard writes (anything else is the user's, and stays).
    if let Err(e) = shards::remove_shard_folder(target) {
        return entry(Status::Failed, 0, Some(e.to_string()));
    }
    match shards::shard_sample(req, source, target) {
        Ok(bytes) => entry(Status::Sharded, bytes, None),
        Err(e) => entry(Status::Failed, 0, Some(e.to_string())),
    }
}

/// Samples, rate and ETA on a terminal; nothing when stderr is not one.
fn progress(len: usize) -> ProgressBar {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(len as u64), target);
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:30} {pos}/{len} samples, {msg} written, {per_sec}, ETA {eta}",
    ) {
        bar.set_style(style);
    }
    bar
}

fn write_manifest(
    plan: &featshard_spec::Plan,
    mesh: featshard_spec::Mesh,
    run: &Run,
    out: &Path,
    entries: &[SampleEntry],
) -> Result<(), Failure> {
    let m = DatasetManifest {
        version: DATASET_VERSION,
        spec: plan.source.clone(),
        mesh: plan.mesh.named(mesh),
        workflow: run.workflow.map(str::to_owned),
        samples: entries.to_vec(),
    };
    featshard_exec::shard_folder::write_dataset(out, &m).map_err(Failure::Other)
}

fn summary(entries: &[SampleEntry], out: &Path) -> Result<String, Failure> {
    let count = |s: Status| entries.iter().filter(|e| e.status == s).count();
    let bytes: u64 = entries.iter().map(|e| e.bytes).sum();
    let line = format!(
        "{} samples into {}: {} sharded, {} already done and verified, {} failed ({:.1} MB of rank files)",
        entries.len(),
        out.display(),
        count(Status::Sharded),
        count(Status::Verified),
        count(Status::Failed),
        bytes as f64 / 1e6
    );
    let failed: Vec<String> = entries
        .iter()
        .filter(|e| e.status == Status::Failed)
        .map(|e| format!("  {}: {}", e.name, e.error.as_deref().unwrap_or("")))
        .collect();
    if failed.is_empty() {
        Ok(line)
    } else {
        Err(Failure::Other(format!(
            "{line}\nfailed:\n{}",
            failed.join("\n")
        )))
    }
}
