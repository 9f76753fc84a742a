//! Plan files (`<module>.plan.json`) as `Plan.from_plan_file` reads them: any text is
//! read or refused with a message; a plan it accepts answers every geometry question
//! the native module asks (layout, shapes, block and domain windows, padded lengths)
//! without a panic, for lengths and a mesh taken from the input.
#![no_main]

use std::collections::BTreeMap;

use featshard::spec::plan::{integrity, spread_evenly, Ownership, Padding};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(plan) = integrity::from_json(text) else {
        return;
    };
    // Lengths and a mesh from the input's last bytes, small enough to lay out.
    let tail: Vec<usize> = data.iter().rev().take(4).map(|&b| usize::from(b)).collect();
    let len = tail.first().copied().unwrap_or(7) % 40 + 1;
    let mesh_sizes = [
        tail.get(1).map_or(2, |b| b % 4 + 1),
        tail.get(2).map_or(3, |b| b % 4 + 1),
    ];
    let Ok(mesh) = plan
        .mesh
        .matched(&mesh_sizes[..plan.mesh.axes().len().min(2)])
    else {
        return;
    };
    let sizes: BTreeMap<String, usize> = plan.semantics.keys().map(|s| (s.clone(), len)).collect();
    let ownership: BTreeMap<String, Ownership> = plan
        .semantics
        .iter()
        .filter_map(|(s, p)| match &p.padding {
            Padding::OwnerBlocks { owner, .. } => {
                let owners = sizes.get(owner).copied().unwrap_or(1).max(1);
                Some((s.clone(), Ownership::Counts(spread_evenly(len, owners))))
            }
            _ => None,
        })
        .collect();
    let Ok(layout) = plan.checked_layout(mesh.sizes(), &sizes, &ownership) else {
        return;
    };
    let names: Vec<&str> = plan.tensors().map(|(n, _)| n).collect();
    let Ok(shapes) = plan.shapes_of(&layout, names) else {
        return;
    };
    for (name, s) in &shapes {
        let t = plan.tensor(name).expect("a feature of the plan");
        for coord in [mesh.coord(0), mesh.coord(mesh.ranks() - 1)] {
            let _ = t.checked_block_window(&s.local_shape, coord);
            let _ = plan.domain_window(t, &s.padded_shape, mesh, coord);
        }
    }
    for semantic in plan.semantics.keys() {
        let _ = plan.padded_length(semantic, len, mesh);
    }
});
