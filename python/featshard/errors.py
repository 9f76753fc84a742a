"""The package's one error class for a sample that cannot reach every rank, and the one
way its ranks agree on an error: a status frame per rank (success, or the failing
rank's error type name, message and rank; the frame ``featshard_exec::agree`` defines
and the Rust runtime's ranks exchange), exchanged when any rank failed (one small
all-reduce tells), and the same exception raised on every rank from the first failure.
The source's own outcome reaches the others with the blocks it sends them
(:func:`send_outcome`) or, where nothing else is sent, by :func:`broadcast_outcome`."""

from __future__ import annotations

import builtins
import pickle
from typing import Any

import torch
import torch.distributed as dist

from featshard import _native

__all__ = [
    "FeatureDistributionError",
    "agree",
    "broadcast_outcome",
    "outcome_message",
    "raise_failure",
    "receive_outcome",
    "same_error",
    "send_outcome",
    "status_of",
]


class FeatureDistributionError(ValueError):
    """A sample that cannot be distributed or scattered as the spec says, raised on
    every rank of the group with the same message.

    A ``ValueError``: the sample or its arguments are at fault. Where one rank failed
    with an exception of a type that cannot be raised again by name on the others,
    ``kind`` is that type's name and ``rank`` the rank that failed; otherwise ``kind``
    is ``"ValueError"`` and ``rank`` is ``None``.
    """

    def __init__(self, message: str, *, kind: str = "ValueError", rank: int | None = None) -> None:
        super().__init__(message if rank is None else f"{kind} on rank {rank}: {message}")
        self.kind = kind
        self.message = message
        self.rank = rank


# One rank's failure as it crosses ranks: the status frame ``featshard_exec::agree``
# defines (the Rust runtime's ranks exchange the same bytes).
Status = bytes


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def status_of(e: BaseException) -> Status:
    """What this rank's failure ``e`` sends to the others."""
    kind = "FeatureDistributionError" if isinstance(e, FeatureDistributionError) else type(e).__name__
    message = e.message if isinstance(e, FeatureDistributionError) else str(e)
    return _native.status_frame(_rank(), kind, message)


def same_error(kind: str, message: str, rank: int) -> Exception:
    """The exception every rank raises for a failure: FeatureDistributionError for one,
    else the failing rank's builtin type and message; another type is named in a
    FeatureDistributionError with its rank."""
    if kind == "FeatureDistributionError":
        return FeatureDistributionError(message)
    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls is not KeyError:
        try:
            return cls(message)
        except TypeError:
            pass
    return FeatureDistributionError(message, kind=kind, rank=rank)


def _raise_failure(frame: Status) -> None:
    failure = _native.read_status(frame)
    if failure is not None:
        raise same_error(*failure)


def agree(failed: Status | None, group: Any, size: int) -> None:
    """Every rank of ``group`` (``size`` ranks) passes its status (``None``: success);
    all raise the first failure's :func:`same_error`, or all return."""
    # One small reduction when every rank succeeded; the frames cross only on failure.
    anyone = torch.tensor([0 if failed is None else 1], dtype=torch.int32)
    dist.all_reduce(anyone, op=dist.ReduceOp.MAX, group=group)
    if int(anyone.item()) == 0:
        return
    frames: list[Any] = [None] * size
    dist.all_gather_object(frames, failed or _native.status_frame(_rank()), group=group)
    for frame in frames:
        _raise_failure(frame)


def broadcast_outcome(outcome: Any, failed: Status | None, src: int, group: Any) -> Any:
    """The source rank ``src`` decides for the group: its ``outcome`` reaches every rank,
    or its failure is raised on every rank (:func:`same_error`). Other ranks pass None."""
    box: list[Any] = [_decision(outcome, failed)]
    dist.broadcast_object_list(box, src=src, group=group)
    frame, payload = box[0]
    _raise_failure(frame)
    return payload


def _decision(outcome: Any, failed: Status | None) -> tuple[Status, Any]:
    """What the source sends: its status frame (a success, or its failure) and, on
    success, its ``outcome``."""
    return (failed or _native.status_frame(_rank()), None if failed else outcome)


def outcome_message(outcome: Any, failed: Status | None) -> torch.Tensor:
    """The source's decision as one message for :func:`send_outcome`: its ``outcome``,
    or its failure."""
    data = pickle.dumps(_decision(outcome, failed))
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def send_outcome(message: torch.Tensor, dst: int, group: Any) -> None:
    """Sends rank ``dst`` the source's decision (:func:`outcome_message`), point to point:
    its length, then itself. The source raises its own failure after sending it."""
    dist.send(torch.tensor([message.numel()], dtype=torch.int64), dst=dst, group=group)
    dist.send(message, dst=dst, group=group)


def receive_outcome(src: int, group: Any) -> tuple[Status | None, Any]:
    """The source ``src``'s decision sent by :func:`send_outcome`: its failure (to be
    agreed on, so that every rank raises it together), or None and its outcome."""
    size = torch.empty(1, dtype=torch.int64)
    dist.recv(size, src=src, group=group)
    message = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(message, src=src, group=group)
    frame, outcome = pickle.loads(message.numpy().tobytes())
    if _native.read_status(frame) is not None:
        return frame, None
    return None, outcome


def raise_failure(failed: Status | None) -> None:
    """Raises this rank's own failure as every rank raises it, if any."""
    if failed is not None:
        _raise_failure(failed)
