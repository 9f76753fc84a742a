//! The `featshard` command line (see [`featshard::cli`]).

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    featshard::staging::cleanup_on_signals();
    let code = featshard::cli::run(std::env::args_os());
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
