"""Ranks on this machine, for tests and single-host runs: ``start_ranks`` runs a worker
in ``world`` processes as ``torch.multiprocessing.spawn`` does, but forks them from a
server that imported torch (and whatever else is named) once.

A spawned rank imports torch anew, seconds of CPU each: on a small test that is most of
its time. The fork server runs no torch op, so no thread pool is forked with it. Where
the platform has no fork server, ranks are spawned.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["PRELOAD", "start_ranks"]

#: What every rank's fork server imports before it forks.
PRELOAD: tuple[str, ...] = (
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "featshard",
    "featshard.distribute",
)


def start_ranks(
    worker: Callable[..., None],
    args: tuple[Any, ...],
    world: int,
    *,
    preload: Sequence[str] = (),
    path: Sequence[str] = (),
) -> None:
    """Runs ``worker(rank, *args)`` for ``rank`` in ``0..world`` in separate processes and
    waits for all; a rank that fails raises here, as with ``torch.multiprocessing.spawn``.

    ``preload`` names modules the fork server imports besides :data:`PRELOAD` (a module
    that cannot be imported is left to the ranks). ``path`` goes in front of
    ``sys.path`` first, so that the server and the ranks find the worker's module and
    the preloaded ones. The server starts on the first call of a process and serves
    every later one: ``preload`` counts on that first call only.
    """
    from torch.multiprocessing.spawn import start_processes

    sys.path[:0] = [p for p in path if p not in sys.path]
    methods = multiprocessing.get_all_start_methods()
    method = "forkserver" if "forkserver" in methods else "spawn"
    if method == "forkserver":
        multiprocessing.set_forkserver_preload([*PRELOAD, *preload])
    start_processes(worker, args=args, nprocs=world, join=True, start_method=method)  # type: ignore[no-untyped-call]
