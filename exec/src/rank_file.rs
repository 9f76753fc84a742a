//! The one reader of a pre-sharded sample's rank files, for every front end
//! (`featshard assemble`, the tch runtime's and the Python package's
//! `PreshardedDataset`): a rank file is opened and checked against its manifest before
//! any block of it is trusted, with the same checks and the same words everywhere:
//! its identity (this run, rank, mesh, layout and encoding), its size and CRC-32 (when
//! verified), the manifest's entries (what the plan makes of its layout), its metadata,
//! and its listing: every feature and passed-through key the manifest lists, each
//! feature's block of the dtype and shape the manifest and the plan make of it (its
//! compact form where the file stores it compact), and nothing the manifest does not
//! list. A file whose checksum was recomputed after an edit is still refused.

use std::collections::BTreeMap;

use featshard_spec::ir::DType;
use featshard_spec::plan::Plan;
use std::path::Path;

use featshard_spec::shards::{Encoding, Manifest, RANK_KEY};

use crate::compact::{stored_entries_of, stored_form};
use crate::files::{sum_of, Mapped, Sample};

/// A rank file's tensors: name to dtype (`None` for one featshard has no name for) and
/// shape.
pub(crate) type Listing = BTreeMap<String, (Option<DType>, Vec<usize>)>;

/// The listing of a rank file read by this crate's reader.
pub(crate) fn listing_of(sample: &Sample) -> Listing {
    sample
        .iter()
        .map(|(n, x)| (n.clone(), (Some(x.dtype()), x.shape())))
        .collect()
}

/// `Err` naming the first tensor of `found` (a rank file's listing) that is not what
/// `manifest` (checked against `plan`) says the file holds, or the first one missing.
pub(crate) fn check_listing(
    plan: &Plan,
    manifest: &Manifest,
    found: &Listing,
) -> Result<(), String> {
    for name in manifest.features.keys().chain(&manifest.passthrough) {
        if !found.contains_key(name) {
            return Err(format!(
                "feature `{name}`: in the manifest, not in the rank file"
            ));
        }
    }
    for (name, (dtype, shape)) in found {
        if manifest.passthrough.contains(name) {
            continue;
        }
        let (Some(entry), Some(t)) = (manifest.features.get(name), plan.tensor(name)) else {
            return Err(format!(
                "holds `{name}`, which the manifest does not list (added after the run?)"
            ));
        };
        let local = &entry.local_shape;
        let compact = (manifest.encoding == Encoding::Compact)
            .then(|| stored_form(t, local, stored_entries_of(shape)))
            .flatten();
        let (want_dtype, want_shape, how) = match compact {
            Some((form, d, s)) => (d, s, format!(" (stored compact: {})", form.name())),
            None => (t.dtype, local.clone(), String::new()),
        };
        if *dtype != Some(want_dtype) || *shape != want_shape {
            let given = dtype.map_or("a dtype featshard does not write", |d| d.name());
            return Err(format!(
                "feature `{name}`: the rank file holds {shape:?} {given}, the manifest says {want_shape:?} {}{how}",
                want_dtype.name()
            ));
        }
    }
    Ok(())
}

/// Rank file `path`, rank `rank` of the sample `manifest` describes (whose layout's
/// digest is `layout_sha256`), opened and checked as the module says; with `verify`,
/// its size and CRC-32 too (one read of every byte). The error names the file.
pub fn open_checked(
    plan: &Plan,
    manifest: &Manifest,
    layout_sha256: &str,
    path: &Path,
    rank: usize,
    verify: bool,
) -> Result<Mapped, String> {
    RunFiles::new(plan, manifest, layout_sha256).open(path, rank, verify)
}

/// The rank files of one run, each opened and checked by [`RunFiles::open`] as
/// [`open_checked`] does; the manifest's entries, the same for every rank, are checked
/// against the plan once (after the first file's identity has vouched for the layout).
#[derive(Debug)]
pub struct RunFiles<'a> {
    plan: &'a Plan,
    manifest: &'a Manifest,
    layout_sha256: &'a str,
    entries: std::sync::OnceLock<Result<(), String>>,
}

impl<'a> RunFiles<'a> {
    /// The run of `manifest` (whose layout's digest the reader computed as
    /// `layout_sha256`), read for `plan`.
    pub fn new(plan: &'a Plan, manifest: &'a Manifest, layout_sha256: &'a str) -> Self {
        RunFiles {
            plan,
            manifest,
            layout_sha256,
            entries: std::sync::OnceLock::new(),
        }
    }

    /// Rank `rank`'s file at `path`, mapped and checked (see [`open_checked`]).
    pub fn open(&self, path: &Path, rank: usize, verify: bool) -> Result<Mapped, String> {
        let (plan, manifest) = (self.plan, self.manifest);
        let at = |e: String| format!("{}: {e}", path.display());
        let file = Mapped::open(path).map_err(|e| e.to_string())?;
        let mut metadata = file.header().metadata.clone();
        let entry = metadata.remove(RANK_KEY);
        manifest
            .check_rank(entry.as_deref(), rank, self.layout_sha256)
            .map_err(at)?;
        if verify {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let folder = path.parent().unwrap_or(Path::new("."));
            manifest
                .check_file(&name, sum_of(file.bytes()))
                .map_err(|e| format!("{}: {e}", folder.display()))?;
        }
        let entries = self.entries.get_or_init(|| manifest.check_entries(plan));
        entries.clone().map_err(at)?;
        if metadata != manifest.metadata {
            return Err(at(
                "the manifest's metadata differs from the rank files' (edited after the run?)"
                    .into(),
            ));
        }
        check_listing(plan, manifest, &listing_of(&file.sample())).map_err(at)?;
        Ok(file)
    }
}
