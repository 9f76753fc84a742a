//! Errors of the distributed layer. Every rank of a step returns the same error, so
//! each names the rank where it started.

use std::fmt;

use crate::error::RuntimeError;

/// Why a distributed step failed; every rank of the group returns the same error.
#[derive(Debug, Clone, PartialEq)]
pub enum DistError {
    /// The launcher environment or the mesh is not usable.
    Setup {
        /// What is wrong with it.
        message: String,
    },
    /// A c10d call failed: a timeout, a peer that went away, a shape mismatch.
    Collective {
        /// The collective.
        op: &'static str,
        /// The group it ran on.
        group: String,
        /// What c10d said.
        message: String,
    },
    /// The source rank of a CP group could not produce its sample (after retries).
    Source {
        /// The source rank.
        rank: usize,
        /// The sample's index in the serial dataset, when known.
        sample: Option<usize>,
        /// Why.
        message: String,
    },
    /// A rank failed on what it received; every rank of the group reports it.
    Rank {
        /// The rank that failed.
        rank: usize,
        /// Why.
        message: String,
    },
    /// The ranks of a step disagree on the spec, the workflow, the mesh or the source.
    Disagree {
        /// Which term, and both sides.
        message: String,
    },
    /// What the source announced does not match what arrived (a bug or a mixed build).
    Protocol {
        /// What did not match.
        message: String,
    },
    /// The sample or blocks do not fit the plan (on the rank that found it).
    Runtime(RuntimeError),
}

impl fmt::Display for DistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DistError::Setup { message } => write!(f, "distributed setup: {message}"),
            DistError::Collective { op, group, message } => {
                write!(f, "{op} on group `{group}` failed: {message}")
            }
            DistError::Source {
                rank,
                sample: Some(i),
                message,
            } => write!(f, "source rank {rank} failed on sample {i}: {message}"),
            DistError::Source {
                rank,
                sample: None,
                message,
            } => write!(f, "source rank {rank} failed: {message}"),
            DistError::Rank { rank, message } => write!(f, "rank {rank} failed: {message}"),
            DistError::Disagree { message } => write!(f, "{message}"),
            DistError::Protocol { message } => write!(f, "distribution protocol: {message}"),
            DistError::Runtime(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for DistError {}

impl From<RuntimeError> for DistError {
    fn from(e: RuntimeError) -> Self {
        DistError::Runtime(e)
    }
}
