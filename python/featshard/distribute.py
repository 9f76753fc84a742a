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

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.utils.dlpack import from_dlpack

from featshard import Plan, _native, blocks
from featshard.blocks import Wire, buffer_views, expand, expand_on_device, place
from featshard.errors import (
    FeatureDistributionError,
    Status,
    agree,
    outcome_message,
    receive_outcome,
    send_outcome,
    status_of,
)

__all__ = ["FeatureDistributionError", "cp_group", "distribute_features", "mesh_dims", "placements"]


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


CpGroup = tuple[dist.ProcessGroup, list[int], DeviceMesh]

# One process group per CP group layout, made once: creating groups is collective.
_GROUPS: dict[tuple[tuple[int, ...], ...], dist.ProcessGroup] = {}
_WORLD: list[dist.ProcessGroup] = []


def mesh_dims(plan: Plan, mesh: DeviceMesh) -> tuple[int | None, list[int]]:
    """The DP dimension of ``mesh`` (if it has one) and its CP dimensions, by the spec's
    names for them (``mesh_dim_names``); a mesh named otherwise is refused by name."""
    names = mesh.mesh_dim_names
    return plan.mesh_dims(list(names) if names is not None else None, mesh.mesh.dim())


def cp_group(plan: Plan, mesh: DeviceMesh) -> CpGroup:
    """This rank's CP process group, its ranks in mesh order and the CP sub-mesh.
    ``mesh`` is the spec's CP mesh ((cp0, cp1) or (cp,)), with the DP axis in front if
    it has one, its dimensions named as the spec names them. Collective the first time
    a layout is seen: every rank calls it."""
    dp, cp_dims = mesh_dims(plan, mesh)
    full = mesh.mesh
    if dp is None:
        planes, cp_mesh = [full], mesh
    else:
        names = mesh.mesh_dim_names or ()
        planes, cp_mesh = list(full), mesh[tuple(names[d] for d in cp_dims)]
    groups = tuple(tuple(int(r) for r in p.flatten().tolist()) for p in planes)
    mine = next(list(g) for g in groups if dist.get_rank() in g)
    if groups not in _GROUPS:
        # Every rank creates every CP group, in the same order; gloo: blocks are on the CPU.
        _GROUPS[groups], _ = dist.new_subgroups_by_enumeration(  # type: ignore[no-untyped-call]
            [list(g) for g in groups], backend="gloo"
        )
    if not _WORLD:
        # The agreement's group: the whole world, on gloo (status flags are CPU tensors).
        world = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        assert isinstance(world, dist.ProcessGroup)
        _WORLD.append(world)
    return _GROUPS[groups], mine, cp_mesh


def _world() -> dist.ProcessGroup:
    """The whole world on gloo, made by the first :func:`cp_group` (collectively)."""
    return _WORLD[0]


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
) -> dict[str, Any]:
    """Distributes one serial sample from the source rank of each CP group.

    ``features`` is the sample on the source rank (None elsewhere); ``src`` the source's
    global rank (default: the group's rank at CP coordinate (0, 0)). ``check``, if given,
    runs on every rank on its local blocks. An error on any rank is raised on every rank
    of the world with the same type and message (every rank of the world calls it for
    each step, as with the Rust distributor). ``group`` is what ``cp_group(mesh)``
    returned (by default it is looked up again). With ``compact``, one-hot features
    travel as indices; the DTensors are the same either way.
    """
    pg, ranks, cp_mesh = group if group is not None else cp_group(plan, mesh)
    sizes = tuple(cp_mesh.size(d) for d in range(cp_mesh.ndim))
    source = ranks[0] if src is None else src
    # Every failure (the source's sample, a buffer, a block, `check`) is agreed on by the
    # whole world below, as the Rust distributor agrees: every rank raises it together,
    # and no rank of another CP group is left waiting.
    if dist.get_rank() == source:
        header, mine, failed = _send_blocks(plan, features, sizes, (pg, ranks, source),
                                            workflow=workflow, threads=threads, compact=compact)
    else:
        (failed, header), mine = receive_outcome(source, pg), None
        if failed is None:
            mine = from_dlpack(_native.receive_buffer(_native.BufferLayout.from_bytes(header[0]).nbytes))
            dist.recv(mine, src=source, group=pg)
    local: dict[str, torch.Tensor] = {}
    if failed is None:
        assert mine is not None
        wire, passthrough = _native.BufferLayout.from_bytes(header[0]), header[1]
        try:
            local = _local_blocks(plan, mine, wire, _device_of(cp_mesh))
            if check is not None:
                check(local)
        except Exception as e:  # noqa: BLE001 - shared with every rank below
            failed = status_of(e)
    agree(failed, _world(), dist.get_world_size())
    on_mesh = placements(plan)
    result: dict[str, Any] = dict(passthrough)
    global_shapes = {slot.name: slot.global_shape for slot in wire.slots if slot.global_shape is not None}
    for name, x in local.items():
        shape = torch.Size(global_shapes[name])
        result[name] = DTensor.from_local(x, cp_mesh, on_mesh[name], run_check=False,
                                          shape=shape, stride=tuple(_native.contiguous_stride(list(shape))))
    return result


def _send_blocks(
    plan: Plan,
    features: Mapping[str, Any] | None,
    sizes: tuple[int, ...],
    to: tuple[dist.ProcessGroup, list[int], int],
    *,
    workflow: str | None,
    threads: int,
    compact: bool,
) -> tuple[Any, torch.Tensor | None, Status | None]:
    """The source's part: places the sample, then sends each other rank of the group,
    one at a time, the header (or the source's error) and its blocks; returns the
    header, the source's own blocks' buffer, and its failure to agree on: to place the
    sample (no header, no buffer), or to write a buffer after the header went out (those
    ranks get zeros)."""
    pg, ranks, source = to
    placed, header, failed = None, None, None
    try:
        if features is None:
            raise ValueError("the source rank was given no sample")
        placed = place(plan, features, sizes, workflow=workflow, threads=threads)
        # The executor's buffer layout as its header bytes, and the values passed through.
        header = (placed.wire(compact=compact).to_bytes(), placed.passthrough)
    except Exception as e:  # noqa: BLE001 - every error is sent to every rank
        failed = status_of(e)
    # Point to point, each rank's header right before its blocks: no collective.
    message = outcome_message(header, failed)
    late: Status | None = None
    for k, r in enumerate(ranks):
        if r == source:
            continue
        send_outcome(message, r, pg)
        if placed is not None:
            buffer, late = _written(placed, _native.coords(sizes, k), threads, compact, late)
            dist.send(buffer, dst=r, group=pg)
            # Freed before the next one is made: its memory is what the next one reuses
            # (two alive at once would outgrow the kept buffers, and every rank's buffer
            # would be new memory, page faults and all).
            del buffer
    if placed is None:
        return None, None, failed
    mine, late = _written(placed, _native.coords(sizes, ranks.index(source)), threads, compact, late)
    return header, mine, late


def _written(
    placed: blocks.Placement, coord: tuple[int, ...], threads: int, compact: bool, late: Status | None
) -> tuple[torch.Tensor, Status | None]:
    """The buffer of the rank at ``coord``, and the first failure to write one so far: a
    buffer that cannot be written is sent as zeros of its length, so that every rank
    still takes its part, and the failure is agreed on."""
    try:
        return placed.rank_buffer(coord, threads, compact=compact), late
    except Exception as e:  # noqa: BLE001 - agreed on by every rank
        return torch.zeros(placed.wire(compact=compact).nbytes, dtype=torch.uint8), late or status_of(e)


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


def _device_of(mesh: DeviceMesh) -> torch.device | None:
    """Where a compact block is expanded: this rank's GPU on a CUDA mesh (only the
    compact block crosses to it, torch expands it there), else None: on the host, by
    the executor."""
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return None
