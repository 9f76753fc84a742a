//! `featshard._native`: the featshard command line run in process (so `pip install
//! featshard` gives the `featshard` command with no Rust toolchain) and the spec
//! crate's plans, for the typed Python package around it. One abi3 module serves every
//! CPython >= 3.10; it links no libtorch.

#![forbid(unsafe_code)]

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Runs the featshard command line `argv` (the program name first) and returns its exit
/// status, the interpreter's lock released meanwhile.
#[pyfunction]
fn main(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| featshard::cli::run(argv))
}

/// The Plan IR of the spec file at `path`, as the JSON `featshard generate` writes to
/// `<module>.plan.json`; a spec error is a `ValueError` with the rendered diagnostic
/// (file, line and column).
#[pyfunction]
fn plan_json(py: Python<'_>, path: std::path::PathBuf) -> PyResult<String> {
    py.detach(|| {
        let (_, plan) = featshard_spec::compile_file(&path)
            .map_err(|d| PyValueError::new_err(format!("{:?}", miette::Report::new(d))))?;
        featshard_codegen::plan_json(&plan).map_err(|e| PyValueError::new_err(e.to_string()))
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_function(wrap_pyfunction!(plan_json, m)?)?;
    Ok(())
}
