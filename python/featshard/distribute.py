"""One serial sample distributed over a context-parallel mesh on ``torch.distributed``,
every rank's blocks made by featshard's byte executor (:mod:`featshard.blocks`).

The source rank of each CP group validates and places the sample, then sends each other
rank of the group, one rank at a time, the metadata (or its error, so that every rank
raises it and nobody is left waiting) and its blocks in one buffer, and makes its own
last: beyond the sample, the source holds one rank's blocks at a time.
Every other rank receives only its own. A feature the spec declares one-hot travels as
its indices (``compact``, the default) and is expanded on the receiving rank, on the
mesh's device. Every rank ends with DTensors built with the plan's placements and
explicit global shape and stride.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.utils.dlpack import from_dlpack

from featshard import Plan, _native, paths
from featshard.blocks import (
    Wire,
    buffer_views,
    carried,
    expand,
    expand_on_device,
    place,
)
from featshard.errors import (
    CollectiveError,
    FeatureDistributionError,
    Status,
    StepsStopped,
    agree,
    collective,
    default_timeout,
    failure_of,
    same_error,
    status_of,
)

__all__ = [
    "CollectiveError",
    "CpGroup",
    "FeatureDistributionError",
    "Prepared",
    "as_dtensor",
    "cp_group",
    "distribute_features",
    "distribute_prepared",
    "mesh_dims",
    "placements",
    "prepare_sample",
]


def placements(plan: Plan, *, dp: bool = False) -> dict[str, tuple[Placement, ...]]:
    """Every tensor feature's DTensor placements on the spec's CP mesh ((cp0, cp1) or
    (cp,)), or with ``dp`` with the DP axis in front after collate, from the plan."""
    return {
        name: tuple(
            Replicate() if d is None else Shard(d)
            for d in (f.placements_dp if dp else f.placements)
        )
        for name, f in plan.features.items()
    }


class CpGroup(NamedTuple):
    """This rank's CP process group (gloo), its global ranks in mesh order, the CP
    sub-mesh, and the whole world on gloo (where every step is agreed on)."""

    group: dist.ProcessGroup
    ranks: list[int]
    mesh: DeviceMesh
    world: dist.ProcessGroup


# Groups made once per layout and timeout: creating groups is collective.
_GROUPS: dict[tuple[tuple[tuple[int, ...], ...], timedelta], dist.ProcessGroup] = {}
_WORLDS: dict[timedelta, dist.ProcessGroup] = {}


def mesh_dims(plan: Plan, mesh: DeviceMesh) -> tuple[int | None, list[int]]:
    """The DP dimension of ``mesh`` (if it has one) and its CP dimensions, by the spec's
    names for them (``mesh_dim_names``); a mesh named otherwise is refused by name."""
    names = mesh.mesh_dim_names
    return plan.mesh_dims(list(names) if names is not None else None, mesh.mesh.dim())


def mesh_terms(plan: Plan, mesh: DeviceMesh, workflow: str | None = None,
               source: int | None = None, sampler: str | None = None) -> _native.Terms:
    """What every rank must hold the same for a step on ``mesh``: the spec, the
    workflow, the mesh's axes (names and sizes) and ranks in order, the source's place
    in its CP group, and what decided the step's sample (``sampler``, a loader's)."""
    names = mesh.mesh_dim_names or tuple(f"dim{d}" for d in range(mesh.mesh.dim()))
    axes = [(str(n), int(k)) for n, k in zip(names, mesh.mesh.shape)]
    order = [int(r) for r in mesh.mesh.flatten().tolist()]
    return _native.Terms(plan.sha256, workflow, axes, order, source, sampler)


def _world(timeout: timedelta) -> dist.ProcessGroup:
    """The whole world on gloo with ``timeout`` (made the first time: collective), where
    steps are agreed on (status votes are CPU tensors, whatever the default backend)."""
    world = _WORLDS.get(timeout)
    if world is None:
        world = collective("creating featshard's gloo group over the world", None,
                           lambda: dist.new_group(backend="gloo", timeout=timeout), timeout=timeout)
        assert isinstance(world, dist.ProcessGroup)
        _WORLDS[timeout] = world
    return world


def cp_group(plan: Plan, mesh: DeviceMesh, *, timeout: timedelta | None = None) -> CpGroup:
    """This rank's CP process group, its ranks in mesh order, the CP sub-mesh and the
    gloo world. ``mesh`` is the spec's CP mesh ((cp0, cp1) or (cp,)), with the DP axis in
    front if it has one, its dimensions named as the spec names them. Every group it
    makes takes ``timeout`` (by default the caller's default group's).

    Collective the first time a layout is seen: every rank calls it, and the ranks first
    agree on the spec and the mesh (names, sizes, rank order), so that a rank that passes
    another mesh, or one named otherwise, is every rank's named error, never a wait."""
    timeout = timeout if timeout is not None else default_timeout()
    world = _world(timeout)
    failed: Status | None = None
    groups: tuple[tuple[int, ...], ...] = ()
    dp: int | None = None
    cp_dims: list[int] = []
    try:
        dp, cp_dims = mesh_dims(plan, mesh)
        planes = [mesh.mesh] if dp is None else list(mesh.mesh.movedim(dp, 0))
        groups = tuple(tuple(int(r) for r in p.flatten().tolist()) for p in planes)
        if not any(dist.get_rank() in g for g in groups):
            raise FeatureDistributionError(f"rank {dist.get_rank()} is not on the mesh {mesh.mesh.tolist()}")
    except Exception as e:  # noqa: BLE001 - agreed on below: every rank raises it
        failed = status_of(e)
    key = (groups, timeout)
    if failed is not None or key not in _GROUPS:
        agree(failed, world, terms=mesh_terms(plan, mesh), what="agreeing on the mesh")
    if key not in _GROUPS:
        # Every rank creates every CP group, in the same order; gloo: blocks are on the CPU.
        made, _ = collective("creating the CP groups", world,
                             lambda: dist.new_subgroups_by_enumeration(  # type: ignore[no-untyped-call]
                                 [list(g) for g in groups], timeout=timeout, backend="gloo"),
                             timeout=timeout)
        _GROUPS[key] = made
    names = mesh.mesh_dim_names or ()
    cp_mesh = mesh if dp is None else mesh[tuple(names[d] for d in cp_dims)]
    mine = next(list(g) for g in groups if dist.get_rank() in g)
    return CpGroup(_GROUPS[key], mine, cp_mesh, world)


def distribute_features(
    plan: Plan,
    features: Mapping[str, Any] | None,
    mesh: DeviceMesh,
    src: int | None = None,
    *,
    workflow: str | None = None,
    threads: int = 1,
    check: Callable[[Mapping[str, torch.Tensor]], None] | None = None,
    group: CpGroup | None = None,
    compact: bool = True,
    timeout: timedelta | None = None,
    sampler: str | None = None,
    stop: bool = False,
) -> dict[str, Any]:
    """Distributes one serial sample from the source rank of each CP group.

    ``features`` is the sample on the source rank (None elsewhere); ``src`` the source's
    global rank (default: the group's rank at CP coordinate (0, 0)). ``check``, if given,
    runs on every rank on its local blocks. An error on any rank is raised on every rank
    of the world with the same type and message (every rank of the world calls it for
    each step, as with the Rust distributor); so are ranks that disagree on the spec,
    the workflow, the mesh or the source. ``group`` is what ``cp_group(plan, mesh)``
    returned (by default it is looked up again, made with ``timeout``). With
    ``compact``, one-hot features travel as indices; the DTensors are the same either
    way. A peer that dies or stops answering ends the step within the groups' timeout
    as a :class:`CollectiveError`. ``sampler`` (a loader's) states what decided which
    sample this step holds: ranks whose statements differ are every rank's named error.
    With ``stop`` this rank takes no more steps: the step is not made, and every rank
    raises :class:`~featshard.errors.StepsStopped` (a loader's thread ends so when its
    caller has left, never starting a step the others will not take).
    """
    cp = group if group is not None else cp_group(plan, mesh, timeout=timeout)
    sizes = tuple(cp.mesh.size(d) for d in range(cp.mesh.ndim))
    source = cp.ranks[0] if src is None else src

    def made() -> _Outgoing:
        if features is None:
            raise ValueError("the source rank was given no sample")
        placed = place(plan, features, sizes, workflow=workflow, threads=threads)
        # The executor's header: the layout and every rank's buffer, passed-through
        # values in slots of their own. Each buffer is written as it is sent.
        return _Outgoing(placed.header(compact=compact),
                         lambda k: placed.rank_buffer(_native.coords(sizes, k), threads, compact=compact))

    return _step(plan, mesh, cp, source, made, workflow=workflow, check=check, sampler=sampler, stop=stop)


# DTensor's own spec types, where this torch has them where 2.13 has them; without
# them every DTensor is made by `from_local`.
try:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec as _DTensorSpec
    from torch.distributed.tensor._dtensor_spec import TensorMeta as _TensorMeta
except ImportError:  # pragma: no cover - another torch's layout
    _DTensorSpec = None  # type: ignore[assignment,misc]



class Prepared(NamedTuple):
    """One sample made ready for its CP group ahead of its step (in a loader's worker
    process): the step header's bytes and every rank's buffer, in the group's rank
    order, views of one tensor in shared memory; or why it could not be (the failing
    exception's type name and message, raised on every rank at its step)."""

    header: bytes | None
    buffers: list[torch.Tensor] | None
    failure: tuple[str, str] | None = None


def prepare_sample(
    plan: Plan,
    features: Mapping[str, Any],
    sizes: tuple[int, ...],
    *,
    workflow: str | None = None,
    threads: int = 1,
    compact: bool = True,
) -> Prepared:
    """``features`` validated and placed on a CP mesh of ``sizes``, every rank's buffer
    written (compact blocks as :func:`distribute_features` sends them) into one tensor
    in shared memory, so that a worker process hands it to the rank's main process
    without a copy. A sample the executor refuses is a :class:`Prepared` holding the
    failure."""
    try:
        placed = place(plan, features, sizes, workflow=workflow, threads=threads)
        header = placed.header(compact=compact).to_bytes()
        nbytes = placed.wire(compact=compact).nbytes
        ranks = math.prod(sizes)
        # Each rank's buffer at an aligned offset: its blocks are views of every dtype.
        stride = -(-nbytes // _native.ALIGN) * _native.ALIGN
        whole = torch.empty(stride * ranks, dtype=torch.uint8)
        whole.share_memory_()  # type: ignore[no-untyped-call]
        buffers = [whole[k * stride:k * stride + nbytes] for k in range(ranks)]
        for k, out in enumerate(buffers):
            out.copy_(placed.rank_buffer(_native.coords(sizes, k), threads, compact=compact))
        return Prepared(header, buffers)
    except Exception as e:  # noqa: BLE001 - raised on every rank at the sample's step
        return Prepared(None, None, failure_of(e))


def distribute_prepared(
    plan: Plan,
    prepared: Prepared | None,
    mesh: DeviceMesh,
    src: int,
    *,
    workflow: str | None = None,
    group: CpGroup | None = None,
    check: Callable[[Mapping[str, torch.Tensor]], None] | None = None,
    timeout: timedelta | None = None,
    sampler: str | None = None,
    stop: bool = False,
) -> dict[str, Any]:
    """:func:`distribute_features` of a sample the source prepared ahead
    (:func:`prepare_sample`): the same step (agreement, each rank its buffer, the same
    DTensors), the source's buffers already written. ``prepared`` is given on the
    source (global rank ``src``), None elsewhere; a failure it holds is raised on every
    rank."""
    cp = group if group is not None else cp_group(plan, mesh, timeout=timeout)

    def made() -> _Outgoing:
        if prepared is None:
            raise ValueError("the source rank was given no prepared sample")
        if prepared.failure is not None:
            raise same_error(*prepared.failure, src)
        assert prepared.header is not None and prepared.buffers is not None
        return _Outgoing(_native.Header.from_bytes(prepared.header), prepared.buffers.__getitem__)

    return _step(plan, mesh, cp, src, made, workflow=workflow, check=check, sampler=sampler, stop=stop)


def _stopping() -> StepsStopped:
    return StepsStopped(f"rank {dist.get_rank()} stopped taking steps: every rank's loader stops at this step")


class _Outgoing(NamedTuple):
    """What the source sends: the header, and the buffer of the group's k-th rank (its
    rank at CP coordinate ``coords(sizes, k)``)."""

    header: _native.Header
    buffer: Callable[[int], torch.Tensor]


def _step(
    plan: Plan,
    mesh: DeviceMesh,
    cp: CpGroup,
    source: int,
    made: Callable[[], _Outgoing],
    *,
    workflow: str | None,
    check: Callable[[Mapping[str, torch.Tensor]], None] | None,
    sampler: str | None = None,
    stop: bool = False,
) -> dict[str, Any]:
    """One step: the source makes its header and buffers (``made``), the world agrees on
    the terms, each rank gets its buffer, the world agrees on the outcome, every rank
    wraps its blocks as DTensors."""
    pg, ranks, cp_mesh, world = cp
    me = dist.get_rank()
    failed: Status | None = None
    outgoing: _Outgoing | None = None
    try:
        if stop:
            raise _stopping()
        if source not in ranks:
            raise FeatureDistributionError(f"src {source} is not a rank of this rank's CP group {ranks}")
        if me == source:
            outgoing = made()
    except Exception as e:  # noqa: BLE001 - agreed on by the whole world
        failed = status_of(e)
    # Before any rank waits on another: the same spec, workflow, mesh, source and
    # sampler everywhere, and a sample the source could place.
    terms = mesh_terms(plan, mesh, workflow, ranks.index(source) if source in ranks else None, sampler)
    agree(failed, world, terms=terms, what="agreeing on the step's terms")
    if me == source:
        assert outgoing is not None
        header = outgoing.header
        mine, failed = _send_blocks(outgoing, (pg, ranks, source))
    else:
        header, mine = _receive_blocks(pg, source)
    local: dict[str, torch.Tensor] = {}
    passthrough: dict[str, Any] = {}
    if failed is None:
        wire = header.buffer
        try:
            passthrough = carried(mine, wire)
            local = _local_blocks(plan, mine, wire, expansion_device(cp_mesh))
            if check is not None:
                check(local)
        except Exception as e:  # noqa: BLE001 - shared with every rank below
            failed = status_of(e)
    agree(failed, world, what="agreeing on the step's outcome")
    on_mesh = placements(plan)
    result: dict[str, Any] = dict(passthrough)
    global_shapes = {slot.name: slot.global_shape for slot in header.buffer.slots if slot.global_shape is not None}
    for name, x in local.items():
        result[name] = as_dtensor(x, cp_mesh, on_mesh[name], global_shapes[name])
    return paths.nested(plan, result)


def as_dtensor(local: torch.Tensor, mesh: DeviceMesh, where: tuple[Placement, ...],
               shape: Sequence[int]) -> DTensor:
    """``local`` as this rank's block of a DTensor of global ``shape`` (contiguous
    stride), placed ``where`` on ``mesh``: what ``DTensor.from_local`` makes with
    ``run_check=False`` and the shape given, made from its spec directly (a step wraps
    every feature; ``from_local``'s autograd function took half the time)."""
    size = torch.Size(shape)
    stride = tuple(_native.contiguous_stride(list(shape)))
    if _DTensorSpec is None or local.requires_grad:
        return DTensor.from_local(local, mesh, where, run_check=False, shape=size, stride=stride)
    spec = _DTensorSpec(mesh, where, tensor_meta=_TensorMeta(size, stride, local.dtype))
    return DTensor(local, spec, requires_grad=False)  # type: ignore[no-untyped-call]


def _send_blocks(
    outgoing: _Outgoing,
    to: tuple[dist.ProcessGroup, list[int], int],
) -> tuple[torch.Tensor, Status | None]:
    """The source's part: sends each other rank of the group, one at a time, the header
    (its length first) and its blocks; returns its own blocks' buffer and its failure to
    write a buffer (that rank got zeros, and the failure is agreed on)."""
    pg, ranks, source = to
    message = torch.frombuffer(bytearray(outgoing.header.to_bytes()), dtype=torch.uint8)
    length = torch.tensor([message.numel()], dtype=torch.int64)
    late: Status | None = None
    for k, r in enumerate(ranks):
        if r == source:
            continue
        what = f"sending rank {r} its blocks from source rank {source}"
        # Point to point, each rank's header right before its blocks: no collective.
        collective(what, pg, partial(dist.send, length, dst=r, group=pg))
        collective(what, pg, partial(dist.send, message, dst=r, group=pg))
        buffer, late = _written(outgoing, k, late)
        collective(what, pg, partial(dist.send, buffer, dst=r, group=pg))
        # Freed before the next one is made: its memory is what the next one reuses
        # (two alive at once would outgrow the kept buffers, and every rank's buffer
        # would be new memory, page faults and all).
        del buffer
    mine, late = _written(outgoing, ranks.index(source), late)
    return mine, late


def _receive_blocks(pg: dist.ProcessGroup, source: int) -> tuple[_native.Header, torch.Tensor]:
    """A receiver's part: the source's header (its length first), then this rank's
    buffer."""
    what = f"receiving rank {dist.get_rank()}'s blocks from source rank {source}"
    length = torch.empty(1, dtype=torch.int64)
    collective(what, pg, lambda: dist.recv(length, src=source, group=pg))
    message = torch.empty(int(length.item()), dtype=torch.uint8)
    collective(what, pg, lambda: dist.recv(message, src=source, group=pg))
    try:
        header = _native.Header.from_bytes(message.numpy().tobytes())
    except ValueError as e:
        raise FeatureDistributionError(f"unreadable header from source rank {source}: {e}") from None
    mine = from_dlpack(_native.receive_buffer(header.buffer.nbytes))
    collective(what, pg, lambda: dist.recv(mine, src=source, group=pg))
    return header, mine


def _written(outgoing: _Outgoing, k: int, late: Status | None) -> tuple[torch.Tensor, Status | None]:
    """The buffer of the group's ``k``-th rank, and the first failure to write one so
    far: a buffer that cannot be written is sent as zeros of its length, so that every
    rank still takes its part, and the failure is agreed on."""
    try:
        return outgoing.buffer(k), late
    except Exception as e:  # noqa: BLE001 - agreed on by every rank
        return torch.zeros(outgoing.header.buffer.nbytes, dtype=torch.uint8), late or status_of(e)


def _local_blocks(plan: Plan, buffer: torch.Tensor, wire: Wire, device: torch.device | None) -> dict[str, torch.Tensor]:
    """A rank's blocks from its buffer: views of it, compact blocks expanded: on the host
    by the executor, or on the mesh's GPU by torch, the buffer copied there whole first
    (one copy of the bytes received, compact blocks and all; the other blocks are then
    views of it there)."""
    if device is None:
        return expand(plan, buffer_views(buffer, wire), wire)
    # Not blocking: from pinned memory the host queues the copy and the expansions and
    # goes on (torch keeps the buffer until the copy is done); pageable memory is staged
    # by the driver before the call returns, as a blocking copy is.
    return expand_on_device(buffer_views(buffer.to(device, non_blocking=True), wire), wire, device)


def expansion_device(mesh: DeviceMesh) -> torch.device | None:
    """Where a compact block is expanded: this rank's GPU on a CUDA mesh (only the
    compact block crosses to it, torch expands it there), else None: on the host, by
    the executor."""
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return None
