//! The CLI's run-time arguments: any `--mesh` and `--lengths` text parses or is refused
//! with a message, and what parses resolves the example spec without a panic, an
//! overflow or an allocation beyond the limits, on meshes of any size the limits allow
//! (past 256 ranks too), with owner counts given or spread evenly as `explain` does.
#![no_main]

use featshard::commands::{parse_lengths, parse_mesh};
use featshard::spec::plan::{Lengths, RootCounts};
use featshard_fuzz::boltz2_plan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (mesh, lengths) = text.split_once(';').unwrap_or((text, ""));
    let Ok(mesh) = parse_mesh(mesh) else { return };
    // The sizes as the spec's mesh takes them; one that is not its mesh is refused.
    let Ok(mesh) = mesh.sizes(boltz2_plan()) else {
        return;
    };
    let _ = boltz2_plan().pad_multiple("tokens", mesh);
    let Ok(given) = parse_lengths(lengths) else {
        return;
    };
    // As explain does: owned items spread evenly over their owners (bounded by the
    // length limit, which parse_lengths enforced).
    let mut l = Lengths::default();
    for (s, n) in given {
        l.sizes.insert(s, n);
    }
    if let (Some(&t), Some(&a)) = (l.sizes.get("tokens"), l.sizes.get("atoms")) {
        if t > 0 && t <= 1 << 16 {
            let per = a / t;
            let mut c = vec![per; t];
            c[t - 1] += a - per * t;
            l.counts.insert("atoms".into(), RootCounts::Each(c));
        }
    }
    let _ = boltz2_plan().resolve(mesh, &l, Some("inference"));
    // As explain does now: spread evenly over any number of owners, none included
    // (items without owners are refused by name, never dropped).
    if l.sizes.contains_key("tokens") && l.sizes.contains_key("atoms") {
        l.counts.insert("atoms".into(), RootCounts::Even);
        let resolved = boltz2_plan().resolve(mesh, &l, Some("inference"));
        if l.sizes["tokens"] == 0 && l.sizes["atoms"] > 0 {
            assert!(resolved.is_err(), "atoms without owners resolved");
        }
    }
});
