"""The package's one error class for a sample that cannot reach every rank."""

from __future__ import annotations

__all__ = ["FeatureDistributionError"]


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
