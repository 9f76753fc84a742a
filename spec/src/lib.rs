//! featshard's model: the Spec IR, its validation, the one placement inference and the
//! Plan IR.
//!
//! ```text
//! YAML --lower--> Spec IR --check/infer--> Plan IR --resolve(mesh, lengths)--> shapes
//! ```
//!
//! Every front end (YAML here, the derive macro elsewhere) builds the same
//! [`syntax::RawSpec`], lowers it with [`lower`] into the same [`ir::Spec`] and calls
//! [`plan::plan`]; no other crate decides a placement.
//!
//! The public surface is the two IRs ([`ir`], [`plan`]), the syntax tree both front ends
//! build ([`syntax`]), the geometry a runtime executes ([`layout`], [`shards`],
//! [`replicas`]), the mesh in numbers ([`mesh`]),
//! errors ([`diag`], [`loc`]), [`limits`] and [`names`]. Validation (`check`), the
//! placement inference (`infer`) and lowering (`lower`) are internal: what they decide
//! reaches other crates only through the plan.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod check;
mod deliver;
pub mod diag;
mod infer;
pub mod ir;
pub mod layout;
pub mod limits;
pub mod loc;
mod lower;
pub mod mesh;
pub mod names;
mod ownership;
pub mod plan;
pub mod replicas;
pub mod shards;
pub mod syntax;

pub use diag::{Diagnostics, SpecError};
pub use ir::{DType, PadValue, Placement, Spec};
pub use lower::{lower, parse_str, sha256_hex};
pub use mesh::{Coord, DeviceMesh, Mesh};
pub use plan::{Lengths, Plan, Resolved, Split};

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

/// Reads spec text, refusing more than [`limits::MAX_SPEC_BYTES`]. The read itself is
/// bounded, so a device or a pipe (`/dev/zero`) that never ends is refused too.
pub fn read_spec(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    // The type first: opening a FIFO for reading would wait for a writer forever.
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read spec: {e}"))?;
    if !meta.is_file() {
        return Err("cannot read spec: not a regular file".into());
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read spec: {e}"))?;
    let mut bytes = Vec::new();
    let limit = limits::MAX_SPEC_BYTES as u64;
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read spec: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "spec is more than the limit of {} bytes",
            limits::MAX_SPEC_BYTES
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        let good = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = good.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = good.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
        format!(
            "spec is not UTF-8: an invalid byte at line {line}, column {column} (save it as UTF-8)"
        )
    })
}
