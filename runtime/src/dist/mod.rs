//! Distribution through PyTorch's own collectives (c10d): process groups, the
//! `(dp, cp0, cp1)` mesh, sample distribution with error propagation, DP collate and
//! sharded data loading.

mod ffi;

pub mod error;
pub mod group;

pub use error::DistError;
pub use group::{nccl_compiled, Backend, GroupOptions, ProcessGroup, ReduceOp, Rendezvous};
