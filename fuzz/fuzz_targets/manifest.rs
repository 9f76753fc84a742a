//! The shard manifest reader: any text is read or refused with a message; a manifest
//! it accepts has every size and position within bounds, so its layout resolves.
#![no_main]

use featshard_fuzz::boltz2_plan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(m) = featshard::spec::shards::parse(text, boltz2_plan()) else {
        return;
    };
    let world = m.layout.mesh.ranks();
    assert!(world <= featshard::spec::limits::MAX_RANKS);
    let names: Vec<&str> = m.features.keys().map(String::as_str).collect();
    boltz2_plan()
        .shapes_of(&m.layout, names)
        .expect("a parsed manifest resolves");
    let digest = featshard::spec::shards::layout_digest(&m.layout).expect("a layout serializes");
    // What readers check next: any rank identity, the entries, any file sum.
    let _ = m.check_rank(Some(text), 0, &digest);
    let _ = m.check_entries(boltz2_plan());
    let sum = featshard::spec::shards::FileSum {
        bytes: data.len() as u64,
        crc32: 0,
    };
    let _ = m.check_file("rank-0.safetensors", sum);
});
