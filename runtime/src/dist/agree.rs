//! The agreement of `featshard_exec::agree` over a c10d group: one all-reduce of every
//! rank's vote, and the status frames only when the vote is not unanimous. The Python
//! package's ranks exchange the same votes and frames.

use featshard_exec::agree::{frame_of, unanimous, verdict, vote, Status, Terms, STATUS_BYTES};
use tch::{Device, Tensor};

use super::error::DistError;
use super::group::{ProcessGroup, ReduceOp};

/// Every rank of `group` passes its status and, where the step has them, its terms;
/// every rank returns the same outcome: the first failure in rank order, the ranks'
/// disagreement on their terms (naming both sides), or `Ok`.
pub(crate) fn agree(
    group: &ProcessGroup,
    status: Status,
    terms: Option<&Terms>,
) -> Result<(), DistError> {
    let mut ballot = Tensor::from_slice(&vote(status.failed(), terms)).to_device(group.device());
    group.all_reduce(&mut ballot, ReduceOp::Max)?;
    let reduced = Vec::<i64>::try_from(&ballot.to_device(Device::Cpu)).map_err(protocol)?;
    if unanimous(&reduced) {
        return Ok(());
    }
    settle(group, status, terms)
}

/// The frames' exchange alone: every rank's failure or terms, and the verdict on them
/// (for a step whose own reduction already said that something is off).
pub(crate) fn settle(
    group: &ProcessGroup,
    status: Status,
    terms: Option<&Terms>,
) -> Result<(), DistError> {
    let mine = frame_of(group.ranks()[group.rank()], &status, terms).encode();
    let all = group.all_gather(&Tensor::from_slice(&mine).to_device(group.device()))?;
    let mut frames = Vec::with_capacity(all.len());
    for t in &all {
        let mut bytes = vec![0u8; STATUS_BYTES];
        t.to_device(Device::Cpu)
            .f_copy_data_u8(&mut bytes, STATUS_BYTES)
            .map_err(protocol)?;
        frames.push(Status::decode(&bytes));
    }
    match verdict(&frames) {
        Status::Ok | Status::Terms { .. } => Ok(()),
        Status::Source {
            rank,
            sample,
            message,
        } => Err(DistError::Source {
            rank,
            sample,
            message,
        }),
        Status::Rank { rank, message, .. } => Err(DistError::Rank { rank, message }),
        Status::Disagree { message } => Err(DistError::Disagree { message }),
    }
}

fn protocol(e: impl std::fmt::Display) -> DistError {
    DistError::Protocol {
        message: e.to_string(),
    }
}
