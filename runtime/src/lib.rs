//! featshard's runtime: executes a [`Plan`](featshard_spec::Plan) on tch tensors.
//!
//! ```text
//! serial sample --check--> lengths, owners --Plan::layout--> SampleLayout
//!               --place--> Placed (index values remapped, diagonals checked)
//! Placed --into_padded--> padded global tensors --block(rank)--> local views + DTensor metadata
//! Placed --write_block(rank)--> one rank's block, written straight into a send buffer
//! blocks of every rank --assemble--> padded global --unpad--> serial sample
//! ```
//!
//! Every rule (placements, padded lengths, owner-block positions, remaps) comes from
//! the plan, and every check, padded window, block and the way back run in the byte
//! executor (`featshard_exec`) on views of tensor memory: this crate adapts tensors to
//! it, and distributes blocks over c10d.

// `unsafe` only in the FFI boundary modules (`dist::ffi`, `views`), which allow it.
#![deny(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "c10d")]
pub mod dist;
pub mod error;
pub mod files;
pub mod intake;
pub mod kind;
pub mod mapping;
pub mod pad;
pub mod sample;
pub mod shard;
pub mod synthetic;
mod views;

pub use error::RuntimeError;
pub use intake::{intake, Intake};
pub use pad::{pad, place, IntakeReport, Padded, Placed};
pub use sample::{Features, Options};
pub use shard::{assemble, unpad, DTensorMeta, LocalBlock};
