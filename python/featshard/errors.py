"""The package's errors for a sample that cannot reach every rank, and the one way its
ranks agree on a step (``featshard_exec::agree``, the Rust runtime's ranks' too).

Each rank votes in one small all-reduce: whether it failed, and the digest of its
terms (the spec, the workflow, the mesh and its rank order, the source). Only when the
vote is not unanimous do the ranks exchange one fixed-size status frame each (their
failure, or their terms), and every rank raises the same exception: the first failure
in rank order, or a disagreement naming both sides.

Every collective featshard issues goes through :func:`collective`: a peer that died,
failed or called with other arguments ends it within the group's timeout (the caller's:
see :func:`default_timeout`) as a :class:`CollectiveError` that says what was under way.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from featshard import _native

__all__ = [
    "CollectiveError",
    "FeatureDistributionError",
    "StepsStopped",
    "agree",
    "backend_options",
    "collective",
    "default_timeout",
    "failure_of",
    "same_error",
    "settle",
    "status_of",
    "timeout_of",
]

T = TypeVar("T")


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


class StepsStopped(FeatureDistributionError):
    """A rank's loop stopped taking steps (a step limit, an exception, an interrupt):
    at the next step every rank's loader stops too, this raised where its caller still
    reads, instead of a step one rank would wait on alone."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.kind = "StepsStopped"


class CollectiveError(RuntimeError):
    """A collective featshard issued did not complete on this rank: a peer died, failed
    in a collective of its own, or called with other arguments (another source, mesh or
    group), and c10d gave up within the group's timeout. ``what`` says what was under
    way, ``timeout`` is the group's timeout (None where c10d does not tell it)."""

    def __init__(self, what: str, cause: BaseException, timeout: timedelta | None) -> None:
        said = str(cause).strip().splitlines()
        within = f" (the group's timeout is {timeout.total_seconds():g} s)" if timeout is not None else ""
        super().__init__(
            f"rank {_rank()}: {what} did not complete{within}: a peer died, failed, or called"
            f" with other arguments; c10d said: {said[0] if said else type(cause).__name__}"
        )
        self.what = what
        self.timeout = timeout


# One rank's failure as it crosses ranks: the status frame ``featshard_exec::agree``
# defines (the Rust runtime's ranks exchange the same bytes).
Status = bytes


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def timeout_of(group: Any) -> timedelta | None:
    """The timeout of ``group``'s backend (gloo's on the CPU, else NCCL's), or None where
    torch does not tell it."""
    for device in ("cpu", "cuda"):
        try:
            found = group._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError, ValueError):
            continue
        if isinstance(found, timedelta):
            return found
    return None


def default_timeout() -> timedelta:
    """The timeout the caller gave the default process group (``init_process_group``'s
    ``timeout``): what every group featshard makes takes unless told otherwise."""
    found = timeout_of(dist.distributed_c10d._get_default_group())
    return found if found is not None else dist.default_pg_timeout


def backend_options(device_type: str, timeout: timedelta | None = None) -> Any:
    """Options for a group on ``device_type`` ("cpu": gloo, "cuda": NCCL) with
    ``timeout`` (by default the caller's default group's): how a DeviceMesh featshard
    makes gives its groups the caller's timeout (``backend_override``)."""
    options: Any
    if device_type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
    else:
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = timeout if timeout is not None else default_timeout()
    return options


def collective(what: str, group: Any, call: Callable[[], T], *, timeout: timedelta | None = None) -> T:
    """``call()``, a collective on ``group`` (or the creation of a group with
    ``timeout``); c10d's failure (a timeout, a peer gone) is a :class:`CollectiveError`
    saying ``what`` was under way."""
    try:
        return call()
    except RuntimeError as e:  # DistBackendError and gloo's errors are RuntimeErrors
        raise CollectiveError(what, e, timeout if timeout is not None else timeout_of(group)) from e


def failure_of(e: BaseException) -> tuple[str, str]:
    """A failure as the ranks tell it (and a worker process hands it over): its kind and
    message, which :func:`same_error` makes an exception of again."""
    if isinstance(e, StepsStopped):
        return ("StepsStopped", e.message)
    if isinstance(e, FeatureDistributionError):
        return ("FeatureDistributionError", e.message)
    return (type(e).__name__, str(e))


def status_of(e: BaseException) -> Status:
    """What this rank's failure ``e`` sends to the others."""
    return _native.status_frame(_rank(), *failure_of(e))


def same_error(kind: str, message: str, rank: int | None) -> Exception:
    """The exception every rank raises for a failure: FeatureDistributionError for one,
    else the failing rank's builtin type and message; another type is named in a
    FeatureDistributionError with its rank."""
    if kind == "FeatureDistributionError":
        return FeatureDistributionError(message)
    if kind == "StepsStopped":
        return StepsStopped(message)
    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls is not KeyError:
        try:
            return cls(message)
        except TypeError:
            pass
    return FeatureDistributionError(message, kind=kind, rank=rank)


def agree(
    failed: Status | None,
    group: Any,
    *,
    terms: _native.Terms | None = None,
    device: str | torch.device = "cpu",
    what: str = "agreeing on a step",
) -> None:
    """Every rank of ``group`` passes its status (``None``: success) and, where the step
    has them, its terms; all raise the same exception (the first failure in rank order,
    or the ranks' disagreement on their terms, naming both sides), or all return.
    ``device`` is where the group's backend takes tensors. The vote is two values
    (``featshard_exec::agree::vote``): gloo reduces so few in a couple of rounds."""
    vote = torch.tensor(_native.vote(failed is not None, terms), dtype=torch.int64, device=device)
    collective(what, group, lambda: dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=group))
    if not _native.unanimous(vote.tolist()):
        settle(failed, group, terms=terms, device=device, what=what)


def settle(
    failed: Status | None,
    group: Any,
    *,
    terms: _native.Terms | None = None,
    device: str | torch.device = "cpu",
    what: str = "agreeing on a step",
) -> None:
    """The second half of :func:`agree`, for a step whose own reduction already said
    that something is off: every rank's status frame (its failure, or its terms) in one
    all-gather, and every rank raises the verdict on them."""
    frame = failed if failed is not None else _native.status_frame(_rank(), terms=terms)
    mine = torch.frombuffer(bytearray(frame), dtype=torch.uint8).to(device)
    frames = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    collective(what, group, lambda: dist.all_gather(frames, mine, group=group))
    verdict = _native.verdict([f.cpu().numpy().tobytes() for f in frames])
    if verdict is not None:
        raise same_error(*verdict)
