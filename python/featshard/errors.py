"""The package's one error class for a sample that cannot reach every rank, and the one
way its ranks agree on an error: a status frame per rank (success, or the failing
rank's error type name, message and rank; the frame ``featshard_exec::agree`` defines
and the Rust runtime's ranks exchange), exchanged once, and the same exception raised
on every rank from the first failure."""

from __future__ import annotations

import builtins
from typing import Any

import torch.distributed as dist

from featshard import _native

__all__ = ["FeatureDistributionError", "agree", "broadcast_outcome", "same_error", "status_of"]


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
    frames: list[Any] = [None] * size
    dist.all_gather_object(frames, failed or _native.status_frame(_rank()), group=group)
    for frame in frames:
        _raise_failure(frame)


def broadcast_outcome(outcome: Any, failed: Status | None, src: int, group: Any) -> Any:
    """The source rank ``src`` decides for the group: its ``outcome`` reaches every rank,
    or its failure is raised on every rank (:func:`same_error`). Other ranks pass None."""
    box: list[Any] = [(failed or _native.status_frame(_rank()), None if failed else outcome)]
    dist.broadcast_object_list(box, src=src, group=group)
    frame, payload = box[0]
    _raise_failure(frame)
    return payload
