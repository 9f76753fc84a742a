//! Any text that compiles: every generated file renders.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok((_, plan)) = featshard_spec::compile_str("fuzz.yaml", text) else {
        return;
    };
    // Rendering must not fail on any valid spec; a failure is a bug.
    featshard_codegen::generate(&plan).expect("a valid spec renders");
    featshard_codegen::generate_tests(&plan).expect("a valid spec renders its test");
});
