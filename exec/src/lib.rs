//! featshard's executor on raw memory: a sample's features as views of its memory-mapped
//! safetensors file, intake and validation as the plan declares them, placement on a
//! mesh, and every rank's blocks written straight into its file. It links no libtorch:
//! `featshard shard` runs on it, and the tch runtime shares its error type and options.
//!
//! ```text
//! files::Mapped --sample--> intake --validate--> place --shard_folder / window--> rank files
//! ```
//!
//! Every number (padded lengths, owner-block positions, block windows) comes from the
//! spec crate's `Plan::layout` and `Plan::shapes_of`; this crate only moves bytes.

#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod agree;
mod alloc;
pub mod array;
pub mod assemble;
pub mod blocks;
pub mod buffer;
pub mod collate;
pub mod compact;
mod deliver;
mod dense;
pub mod dtype;
mod error;
mod feature;
pub mod files;
mod halo;
pub mod header;
pub mod intake;
pub mod local_ids;
mod mapping;
pub mod par;
mod place;
pub mod placed;
pub mod shard_folder;
pub mod sink;
pub mod validate;
pub mod vectors;
mod window;

pub use error::ExecError;
pub use feature::tensor_plan;
pub use intake::Options;
pub use place::{place, place_domain};
pub use placed::{IntakeReport, Placed};
