//! featshard's model: the Spec IR, its validation, the one placement inference and the
//! Plan IR.
//!
//! ```text
//! YAML --lower--> Spec IR --check/infer--> Plan IR --resolve(mesh, lengths)--> shapes
//! ```
//!
//! Every front end (YAML here, the derive macro elsewhere) produces the same
//! [`ir::Spec`] and calls [`plan::plan`]; no other crate decides a placement.

pub mod check;
pub mod diag;
pub mod infer;
pub mod ir;
pub mod layout;
pub mod limits;
pub mod loc;
pub mod lower;
pub mod names;
pub mod pack;
pub mod plan;
pub mod syntax;

pub use diag::{Diagnostics, SpecError};
pub use ir::{DType, PadValue, Placement, Spec};
pub use plan::{Lengths, Plan, Resolved};

/// Parses, validates and plans spec text in one step.
pub fn compile_str(name: &str, text: &str) -> Result<(Spec, Plan), Diagnostics> {
    let spec = lower::parse_str(name, text)?;
    match plan::plan(&spec) {
        Ok(p) => Ok((spec, p)),
        Err(errors) => Err(Diagnostics::new(name, text, errors)),
    }
}

/// Reads a spec file and compiles it; I/O errors come back as a diagnostic too.
pub fn compile_file(path: &std::path::Path) -> Result<(Spec, Plan), Diagnostics> {
    let name = path.display().to_string();
    let text = read_spec(path)
        .map_err(|e| Diagnostics::new(&name, "", vec![SpecError::new(e, loc::Loc::UNKNOWN)]))?;
    compile_str(&name, &text)
}

/// Reads spec text, refusing files over [`limits::MAX_SPEC_BYTES`] before reading them.
pub fn read_spec(path: &std::path::Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read spec: {e}"))?;
    if meta.len() > limits::MAX_SPEC_BYTES as u64 {
        return Err(format!(
            "spec is {} bytes, more than the limit of {} bytes",
            meta.len(),
            limits::MAX_SPEC_BYTES
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read spec: {e}"))?;
    String::from_utf8(bytes).map_err(|e| format!("spec is not UTF-8: {e}"))
}
