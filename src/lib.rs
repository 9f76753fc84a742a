//! featshard: one YAML spec for every context-parallel feature placement, padding plan
//! and generated module.
//!
//! This crate is the facade and the CLI. The model lives in [`spec`]
//! (`featshard-spec`), the emitters in [`codegen`] (`featshard-codegen`).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use featshard_codegen as codegen;
pub use featshard_exec as exec;
pub use featshard_spec as spec;

pub mod cli;
pub mod commands;
pub mod explain;
pub mod findings;
pub mod init;
pub mod picture;
pub mod report;
pub mod room;
mod sizes;
pub mod staging;
mod text;
mod topology;
mod values;

#[cfg(feature = "derive")]
pub use featshard_macros::Features;
#[cfg(feature = "runtime")]
pub use featshard_runtime as runtime;
#[cfg(feature = "runtime")]
pub use tch;

/// Used by the code `#[derive(Features)]` writes; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use serde_json;
}
pub mod assemble;
pub mod dataset;
/// Safetensors files with header metadata (from the runtime).
#[cfg(feature = "runtime")]
pub use featshard_runtime::files;
pub mod shards;
