//! featshard: one YAML spec for every context-parallel feature placement, padding plan
//! and generated module.
//!
//! This crate is the facade and the CLI. The model lives in [`spec`]
//! (`featshard-spec`), the emitters in [`codegen`] (`featshard-codegen`).

pub use featshard_codegen as codegen;
pub use featshard_spec as spec;

pub mod commands;
#[cfg(feature = "runtime")]
pub mod shards;
