//! Compile errors of `#[derive(Features)]`: each on the field or attribute at fault.
//! The cases depend on the macro alone (a local `Tensor` stands in for tch's), so they
//! build without libtorch.
//! Rewrite the expected `.stderr` files with `TRYBUILD=overwrite` after an intended change.

#[test]
fn derive_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
