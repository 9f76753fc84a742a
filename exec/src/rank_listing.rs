//! What a rank file must hold, checked against its sample's manifest before any block
//! of it is trusted: every feature and passed-through key the manifest lists, each
//! feature's block of the dtype and shape the manifest and the plan make of it (its
//! compact form where the file stores it compact), and nothing the manifest does not
//! list. Every reader of rank files (`featshard assemble`, both `PreshardedDataset`s)
//! runs it on the file's tensor list, so a file whose checksum was recomputed after an
//! edit is still refused.

use std::collections::BTreeMap;

use featshard_spec::ir::DType;
use featshard_spec::plan::Plan;
use featshard_spec::shards::{Encoding, Manifest};

use crate::compact::{stored_entries_of, stored_form};
use crate::files::Sample;

/// A rank file's tensors: name to dtype (`None` for one featshard has no name for) and
/// shape.
pub type Listing = BTreeMap<String, (Option<DType>, Vec<usize>)>;

/// The listing of a rank file read by this crate's reader.
pub fn listing_of(sample: &Sample) -> Listing {
    sample
        .iter()
        .map(|(n, x)| (n.clone(), (Some(x.dtype()), x.shape())))
        .collect()
}

/// `Err` naming the first tensor of `found` (a rank file's listing) that is not what
/// `manifest` (checked against `plan`) says the file holds, or the first one missing.
pub fn check_listing(plan: &Plan, manifest: &Manifest, found: &Listing) -> Result<(), String> {
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
