//! Distribution through PyTorch's own collectives (c10d): process groups, the
//! `(dp, cp0, cp1)` mesh, sample distribution with error propagation, DP collate and
//! sharded data loading.

mod agree;
mod ffi;
mod on_device;
mod wire;

pub mod collate;
pub mod distribute;
pub mod error;
pub mod group;
pub mod loader;
pub mod local;
pub mod mesh;
pub mod pool;
pub mod prepare;
pub mod presharded;

pub use collate::{collate, Batch};
pub use distribute::{agree_on, Distributor, Source, SourceFailure};
pub use error::DistError;
pub use group::{nccl_compiled, Backend, GroupOptions, ProcessGroup, ReduceOp, Rendezvous};
pub use loader::{Epoch, LoaderOptions, Order, Samples, SerialDataset, ShardedLoader};
pub use local::{Distributed, LocalSample};
pub use mesh::Mesh;
pub use pool::BufferPool;
pub use prepare::{Prepared, Preparer, Write};
pub use presharded::PreshardedDataset;
