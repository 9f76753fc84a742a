//! Compile errors of `#[derive(Features)]`: each on the field or attribute at fault.
//! Rewrite the expected `.stderr` files with `TRYBUILD=overwrite` after an intended change.
#![cfg(feature = "derive")]

#[test]
fn derive_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
