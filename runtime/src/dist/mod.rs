//! Distribution through PyTorch's own collectives (c10d): process groups, the
//! `(dp, cp0, cp1)` mesh, sample distribution with error propagation, DP collate and
//! sharded data loading.

mod ffi;

pub mod error;
pub mod group;

pub use error::DistError;
pub use group::{nccl_compiled, Backend, GroupOptions, ProcessGroup, ReduceOp, Rendezvous};
pub mod distribute;
pub mod mesh;
mod wire;

pub use distribute::{
    agree_on, distribute, distribute_then, prepare, Distributed, LocalSample, Prepared, Source,
    SourceFailure,
};
pub use mesh::Mesh;
pub mod collate;
pub use collate::{collate, Batch};
pub mod loader;
pub use loader::{Epoch, LoaderOptions, Order, Samples, SerialDataset, ShardedLoader};
