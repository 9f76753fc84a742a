//! featshard's runtime: executes a [`Plan`](featshard_spec::Plan) on tch tensors.
//!
//! ```text
//! serial sample --check--> lengths, owners --Plan::layout--> SampleLayout
//!               --pad--> padded global tensors --block(rank)--> local views + DTensor metadata
//! blocks of every rank --assemble--> padded global --unpad--> serial sample
//! ```
//!
//! Every rule (placements, padded lengths, owner-block positions, remaps) comes from
//! the plan; this crate only moves tensors accordingly.

#[cfg(feature = "c10d")]
pub mod dist;
pub mod error;
pub mod kind;
pub mod pack;
pub mod pad;
pub mod sample;
pub mod shard;
pub mod synthetic;

pub use error::RuntimeError;
pub use pad::{pad, unpad, Padded};
pub use sample::{Features, Options};
pub use shard::{assemble, coords, DTensorMeta, LocalBlock};
