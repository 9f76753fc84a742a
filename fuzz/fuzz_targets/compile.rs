//! Any text: parse, validate, infer, plan, and resolve the plan on a few meshes and
//! lengths. Nothing may panic, hang or grow without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok((_, plan)) = featshard_spec::compile_str("fuzz.yaml", text) else {
        return;
    };
    let mut lengths = featshard_spec::Lengths::default();
    for (i, name) in plan.semantics.keys().enumerate() {
        lengths.sizes.insert(name.clone(), 3 + i % 5);
    }
    for (name, s) in &plan.semantics {
        if let featshard_spec::plan::Padding::OwnerBlocks { root, .. } = &s.padding {
            let owners = lengths.sizes.get(root).copied().unwrap_or(0);
            let counts: Vec<usize> = (0..owners).map(|o| o % 3).collect();
            lengths.sizes.insert(name.clone(), counts.iter().sum());
            lengths
                .counts
                .insert(name.clone(), featshard_spec::plan::RootCounts::Each(counts));
        }
    }
    let meshes: [&[usize]; 6] = [&[1], &[4], &[1, 1], &[2, 3], &[3, 3], &[4, 1]];
    for mesh in meshes.into_iter().filter_map(|s| plan.mesh.matched(s).ok()) {
        let _ = plan.resolve(mesh, &lengths, None);
    }
});
