//! The checks of a rank file against its manifest, with the same words everywhere:
//! its identity (this run, rank, mesh, layout and encoding), its size and CRC-32 (when
//! verified), the manifest's entries (what the plan makes of its layout), its metadata,
//! and its listing: every feature and passed-through key the manifest lists, each
//! feature's block of the dtype and shape the manifest and the plan make of it (its
//! compact form where the file stores it compact), and nothing the manifest does not
//! list. A file whose checksum was recomputed after an edit is still refused.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use featshard_spec::ir::DType;
use featshard_spec::plan::Plan;
use std::path::Path;

use featshard_spec::shards::{Encoding, Manifest, RANK_KEY};

use crate::compact::{stored_entries_of, stored_form};
use crate::files::{sum_of, Mapped, Sample};

/// A rank file's tensors: name to dtype (`None` for one featshard has no name for) and
/// shape.
type Listing = BTreeMap<String, (Option<DType>, Vec<usize>)>;

/// The listing of a rank file read by this crate's reader.
fn listing_of(sample: &Sample) -> Listing {
    sample
        .iter()
        .map(|(n, x)| (n.clone(), (Some(x.dtype()), x.shape())))
        .collect()
}

/// `Err` naming the first tensor of `found` (a rank file's listing) that is not what
/// `manifest` (checked against `plan`) says the file holds, or the first one missing.
fn check_listing(plan: &Plan, manifest: &Manifest, found: &Listing) -> Result<(), String> {
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
/// its size and CRC-32 too (one read of every byte). The manifest's entries, the same
/// for every rank, are checked against the plan once per folder (`entries`, after the
/// first file's identity has vouched for the layout). The error names the file.
pub(super) fn open_checked(
    plan: &Plan,
    manifest: &Manifest,
    layout_sha256: &str,
    entries: &OnceLock<Result<(), String>>,
    path: &Path,
    rank: usize,
    verify: bool,
) -> Result<Mapped, String> {
    let at = |e: String| format!("{}: {e}", path.display());
    let file = Mapped::open(path).map_err(|e| e.to_string())?;
    let mut metadata = file.header().metadata.clone();
    let entry = metadata.remove(RANK_KEY);
    manifest
        .check_rank(entry.as_deref(), rank, layout_sha256)
        .map_err(at)?;
    if verify {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let folder = path.parent().unwrap_or(Path::new("."));
        manifest
            .check_file(&name, sum_of(file.bytes()))
            .map_err(|e| format!("{}: {e}", folder.display()))?;
    }
    let entries = entries.get_or_init(|| manifest.check_entries(plan));
    entries.clone().map_err(at)?;
    if metadata != manifest.metadata {
        return Err(at(
            "the manifest's metadata differs from the rank files' (edited after the run?)".into(),
        ));
    }
    check_listing(plan, manifest, &listing_of(&file.sample())).map_err(at)?;
    Ok(file)
}
