"""The data pipeline around :func:`featshard.distribute.distribute_features`: DP collate,
the datasets (online and pre-sharded) and the DP sampler (the Lightning data module
over them is :mod:`featshard.lightning`).

Every number comes from the plan through the native module: collate's DTensor shapes
(``Plan.collated_shape``), how each sample's block joins its batch (``Plan.collate_join``:
target shape, pad value, the re-pad of indices into a sharded semantic's blocks and of
whole axes holding its layout, applied here by torch on the blocks' device) and the
samples each DP replica reads (``featshard.replica_indices``, the Rust loader's split).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.utils.data import Dataset, Sampler
from torch.utils.dlpack import from_dlpack

from featshard import Plan, _native, paths
from featshard.blocks import dtype_name, expand_block, moved_together, view_at
from featshard.distribute import (
    as_dtensor,
    cp_group,
    distribute_features,
    expansion_device,
    mesh_dims,
    placements,
)
from featshard.errors import (
    FeatureDistributionError,
    Status,
    backend_options,
    collective,
    settle,
    status_of,
)

__all__ = [
    "DistributedFeatureDataset",
    "DpSampler",
    "PreshardedDataset",
    "collate",
    "cpu_mesh_like",
    "dp_sampler",
    "fetch_with_retries",
    "to_device_mesh",
]


def cpu_mesh_like(mesh: DeviceMesh, *, timeout: timedelta | None = None) -> DeviceMesh:
    """The same mesh on CPU with gloo groups on every axis (collectives on CPU tensors
    next to a CUDA mesh whose default backend is NCCL), each group with ``timeout`` (by
    default the caller's default group's). Collective: every rank calls it."""
    options = backend_options("cpu", timeout)
    return DeviceMesh(
        "cpu", mesh.mesh, mesh_dim_names=mesh.mesh_dim_names,
        backend_override=(("gloo", options),) * mesh.mesh.dim(),
    )


def _batch_shapes(
    batch: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, list[int]]], list[dict[str, tuple[str, list[int]] | None]]]:
    """Each sample's blocks' local shapes, and its other values (a tensor's dtype and
    shape, else None), as the executor's collate frame takes them."""
    shapes, others = [], []
    for i, s in enumerate(batch):
        if not isinstance(s, Mapping):
            raise TypeError(f"collate: sample {i} is a {type(s).__name__}, not a mapping of features")
        shapes.append({n: list(x.to_local().shape) for n, x in s.items() if isinstance(x, DTensor)})
        others.append({n: (dtype_name(x.dtype), list(x.shape)) if isinstance(x, torch.Tensor) else None
                       for n, x in s.items() if not isinstance(x, DTensor)})
    return shapes, others


def _agreed_targets(
    plan: Plan, batch: Sequence[Mapping[str, Any]], dp_group: dist.ProcessGroup, device: str
) -> tuple[list[str], dict[str, list[int]]]:
    """The features the batch holds, and each one's local shape agreed with the other DP
    replicas: one all-reduce of max of the executor's collate frame (whether a replica
    failed, its batch size, which features it holds and lacks, the longest length of
    each of their axes), on the mesh's ``device`` (where its groups' backend takes
    tensors). A batch the executor refuses (empty, samples holding different keys, a
    DTensor of another spec) still takes part with a failed frame; then every rank's
    status frame is exchanged and all raise the same error, as for replicas whose
    batches differ."""
    failed: Status | None = None
    try:
        frame = plan.collate_frame(*_batch_shapes(batch))
    except Exception as e:  # noqa: BLE001 - agreed on by every DP replica below
        refused = FeatureDistributionError(str(e)) if type(e) is ValueError else e
        failed, frame = status_of(refused), plan.collate_frame(None)
    reduced = torch.tensor(frame.frame, dtype=torch.int64, device=device)
    collective("collate: agreeing on the batch's shapes", dp_group,
               lambda: dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=dp_group))
    try:
        targets = plan.collate_targets(frame, reduced.tolist())
    except ValueError as e:
        raise FeatureDistributionError(str(e)) from None
    if targets is None:
        settle(failed, dp_group, device=device, what="collate: agreeing on a replica's failure")
        raise FeatureDistributionError("collate: a DP replica failed, but no rank says why")
    return frame.names, targets


def _join_into(x: torch.Tensor, repad: tuple[int, int] | None,
               spread: Sequence[tuple[int, int, int]], out: torch.Tensor) -> None:
    """A sample's block written at the start of ``out`` (its place in the batch, already
    the pad value) as the executor's join says: index values ``v >= 0`` re-padded to
    ``(v // old) * new + v % old``, negative ones (pads of index lists) kept; along each
    spread ``(axis, old, new)``, the block's runs of ``old`` items at the starts of
    ``out``'s runs of ``new``."""
    if repad is not None:
        old, new = repad
        x = torch.where(x >= 0, torch.div(x, old, rounding_mode="floor") * new + x % old, x)
    # Last axis first, so that the earlier axes keep their numbers.
    for axis, old, new in sorted(spread, reverse=True):
        x = x.reshape(*x.shape[:axis], x.shape[axis] // old, old, *x.shape[axis + 1:])
        out = out.view(*out.shape[:axis], out.shape[axis] // new, new, *out.shape[axis + 1:])
    out[tuple(slice(0, n) for n in x.shape)] = x


def collate(plan: Plan, batch: Sequence[Mapping[str, Any]], mesh: DeviceMesh, *,
            group_mesh: DeviceMesh | None = None) -> dict[str, Any]:
    """Stacks this data-parallel replica's samples into DTensors on (dp, cp0, cp1).

    Every rank pads its local blocks to the largest local shape across the batch and
    across DP replicas (one all-reduce of max), so each shard's items keep their place
    and gain pads at the end; indices into a sharded semantic's padded layout, and whole
    axes holding it (a map's global columns on one CP axis), move with its blocks, so
    every index names after collate the item it named before.
    Placements are the plan's DP placements (``Shard(0)`` over dp). Plain tensors are
    stacked, other values (metadata) become lists. The blocks stay on the device they
    are on (the mesh's), and so does the batch. A batch one replica cannot collate is
    every rank's same error. The replicas agree over the dp group of ``group_mesh``
    (``mesh`` by default; a loader making batches while the model computes gives its
    own gloo mesh, :func:`cpu_mesh_like`, so as never to interleave with the model's
    collectives).
    """
    dp, cp_dims = mesh_dims(plan, mesh)
    if dp is None or mesh.mesh_dim_names is None:
        raise ValueError(f"collate: the device mesh has no DP axis `{plan.dp_axis}`: collate"
                         " stacks the samples of DP replicas")
    agreeing = group_mesh if group_mesh is not None else mesh
    dp_group = agreeing.get_group(mesh.mesh_dim_names[dp])
    dp_size = int(mesh.mesh.shape[dp])
    batch = [paths.flat(plan, s) for s in batch]
    cp = tuple(int(mesh.mesh.shape[d]) for d in cp_dims)
    names, target = _agreed_targets(plan, batch, dp_group, agreeing.device_type)
    locals_ = {n: [s[n].to_local() for s in batch] for n in names}
    on_mesh = placements(plan, dp=True)
    out: dict[str, Any] = {}
    for name in names:
        joins = [plan.collate_join(name, {f: list(locals_[f][i].shape) for f in names}, target)
                 for i in range(len(batch))]
        first = locals_[name][0]
        stacked = torch.full((len(batch), *target[name]), joins[0][1], dtype=first.dtype, device=first.device)
        for i, (x, (_, _, repad, spread)) in enumerate(zip(locals_[name], joins)):
            _join_into(x, repad, spread, stacked[i])
        shape = plan.collated_shape(name, target[name], len(batch), dp_size, cp)
        out[name] = as_dtensor(stacked, mesh, on_mesh[name], shape)
    for name in sorted(n for n in batch[0] if n not in out):
        values = [s[name] for s in batch]
        # The executor checked that they stack: the same dtype and shape in every sample.
        out[name] = torch.stack(values) if isinstance(values[0], torch.Tensor) else values
    return paths.nested(plan, out)


def fetch_with_retries(dataset: Dataset[Any], index: int, retries: int) -> Any:
    """``dataset[index]``, or on failure the next samples, at most ``retries`` more times."""
    check_retries(retries)
    n = len(dataset)  # type: ignore[arg-type]
    if not 0 <= index < n:
        raise IndexError(f"sample index {index} is outside the serial dataset's {n} samples")
    last: Exception | None = None
    for k in range(retries + 1):
        try:
            return dataset[(index + k) % n]
        except Exception as e:  # noqa: BLE001 - retried, then re-raised
            last = e
    assert last is not None
    raise last


def check_retries(retries: int) -> None:
    """Refuses a retry count that is not an integer of 0 or more, by name."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries: a count of further samples to try (0 or more), got {retries!r}")


class FailedSample(Mapping[str, Any]):
    """A sample whose fetch failed: reading it re-raises the fetch error on the source,
    which ``distribute_features`` then raises on every rank."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __getitem__(self, key: str) -> Any:
        raise self.error

    def __iter__(self) -> Iterator[str]:
        raise self.error

    def __len__(self) -> int:
        raise self.error


class DistributedFeatureDataset(Dataset[dict[str, Any]]):
    """Wraps a serial dataset (never rewritten): the source rank of each CP group reads
    the sample, every rank of the group gets its DTensors on ``mesh`` (on a CUDA mesh,
    in its GPU's memory). Use with ``num_workers=0`` and the same index on every rank of
    a CP group (see :func:`dp_sampler`). Its groups take ``timeout`` (by default the
    caller's default group's)."""

    def __init__(self, plan: Plan, serial: Dataset[Any], mesh: DeviceMesh, *,
                 retries: int = 0, workflow: str | None = None, threads: int = 1,
                 timeout: timedelta | None = None) -> None:
        check_retries(retries)
        self.plan = plan
        self.serial = serial
        self.mesh = mesh
        self.retries = retries
        self.workflow = workflow
        self.threads = threads
        self.timeout = timeout

    def __len__(self) -> int:
        return len(self.serial)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> dict[str, Any]:
        group = cp_group(self.plan, self.mesh, timeout=self.timeout)
        features: Mapping[str, Any] | None = None
        if dist.get_rank() == group.ranks[0]:
            try:
                features = fetch_with_retries(self.serial, index, self.retries)
            except Exception as e:  # noqa: BLE001 - reported to every rank by distribute
                features = FailedSample(e)
        return distribute_features(self.plan, features, self.mesh, workflow=self.workflow,
                                   threads=self.threads, group=group)


class PreshardedDataset(Dataset[dict[str, Any]]):
    """Samples pre-sharded by ``featshard shard`` over a dataset (``ROOT/<sample>/``):
    each rank opens only its own rank file of each sample (checked and read by the
    executor's one reader of rank files into one buffer), and builds its DTensors with
    explicit shape, stride and placements from the sample's manifest. Compact blocks are checked by the executor,
    then expanded by it on the host, or on a CUDA mesh by torch on the rank's GPU (only
    they cross to it). No source rank, no collective; the same
    indices on every rank of a CP group (see :func:`dp_sampler`) give the online
    ``distribute_features`` result.

    Refuses a folder sharded with another spec or mesh, a manifest whose entries are not
    what the spec makes of its layout, and a rank file that is not this rank's of this
    run and layout, holds a tensor the manifest does not list (or lacks one, or holds
    one of another dtype or shape), or (with ``verify``, the default) whose size or
    CRC-32 is not what was written: one more read of the rank file per sample, by the
    executor's reader of rank files, as ``featshard assemble`` checks them.
    """

    def __init__(self, plan: Plan, root: str | Path, mesh: DeviceMesh, *, verify: bool = True,
                 timeout: timedelta | None = None) -> None:
        self.plan = plan
        self.verify = verify
        self.root = Path(root)
        self.mesh = mesh
        group = cp_group(plan, mesh, timeout=timeout)
        self.cp_mesh = group.mesh
        self.cp = tuple(self.cp_mesh.size(d) for d in range(self.cp_mesh.ndim))
        self.rank = group.ranks.index(dist.get_rank())
        self._placements = placements(plan)
        # Read and checked against the plan and the mesh in Rust, as `featshard shard`
        # reads it on resume.
        self.names = plan.read_dataset(self.root, self.cp)

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> dict[str, Any]:
        # The folder's manifest and this rank's file, checked by the executor (the
        # mesh too) and read from one map into one buffer.
        manifest = self.plan.shard_folder(self.root / self.names[index], self.cp)
        capsule, listed, header = manifest.read_rank_file(self.rank, self.verify)
        path = Path(manifest.rank_path(self.rank))
        buffer = from_dlpack(capsule)
        tensors = {name: view_at(buffer, at, nbytes, dtype, shape) for name, dtype, shape, at, nbytes in listed}
        stored = {k: x for k, x in tensors.items() if manifest.stored_slot(k) is not None}
        device = expansion_device(self.cp_mesh)
        tensors.update(_dense(manifest, stored, path, device))
        out: dict[str, Any] = {}
        for key, x in tensors.items():
            dtensor = manifest.dtensor_shape(key)
            if dtensor is None:
                out[key] = x
                continue
            shape, stride = dtensor
            # On a CUDA mesh every block is on its GPU, as the online path gives it:
            # the expanded ones already, the rest copied as they are stored.
            out[key] = DTensor.from_local(
                x if device is None else x.to(device), self.cp_mesh, self._placements[key], run_check=False,
                shape=torch.Size(shape), stride=tuple(stride),
            )
        out.update(header)
        return paths.nested(self.plan, out)


def _dense(
    manifest: Any, stored: Mapping[str, torch.Tensor], path: Path, device: torch.device | None = None
) -> dict[str, torch.Tensor]:
    """The blocks a rank file stores compact (``featshard shard --encoding compact``) as
    the model takes them, checked by the executor first: expanded by it into one new
    buffer on the host, or with ``device`` (a CUDA mesh's GPU) by torch there, so that
    only the compact blocks cross to it, all in one copy."""
    if not stored:
        return {}
    capsules = [(name, x.contiguous().__dlpack__()) for name, x in stored.items()]
    if device is not None:
        manifest.check_stored(capsules, str(path))
        there = moved_together(stored, device)
        return {name: expand_block(x, manifest.stored_slot(name), device) for name, x in there.items()}
    capsule, offsets = manifest.expand_stored(capsules, str(path))
    buffer = from_dlpack(capsule)
    out = {}
    for name, at in zip(stored, offsets):
        slot = manifest.stored_slot(name)
        out[name] = view_at(buffer, at, slot.dense_nbytes, slot.dense_dtype, slot.dense_shape)
    return out


class DpSampler(Sampler[int]):
    """The samples of this rank's DP replica, the split featshard's Rust loader makes:
    every rank of a CP group gets the same indices, in dataset order or shuffled by seed
    and epoch (:meth:`set_epoch`); the tail wraps around so every replica reads as many
    (``drop_last`` drops it instead)."""

    def __init__(self, plan: Plan, dataset: Dataset[Any], mesh: DeviceMesh, *, shuffle: bool,
                 seed: int = 0, drop_last: bool = False) -> None:
        check_count("seed", seed)
        self.n = len(dataset)  # type: ignore[arg-type]
        # The DP axis by the spec's name for it, never by the mesh's dimension count.
        dp, _ = mesh_dims(plan, mesh)
        if dp is not None:
            coord = mesh.get_coordinate()
            if coord is None:
                raise ValueError("dp_sampler: this rank is not on the mesh")
            self.replicas, self.replica = int(mesh.mesh.shape[dp]), coord[dp]
        else:
            self.replicas, self.replica = 1, 0
        self.seed = seed if shuffle else None
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose permutation the next iteration draws (training)."""
        check_count("epoch", epoch)
        self.epoch = epoch

    def _indices(self) -> list[int]:
        return _native.replica_indices(self.n, self.replicas, self.replica, epoch=self.epoch,
                                       seed=self.seed, drop_last=self.drop_last)

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices())

    def __len__(self) -> int:
        return len(self._indices())


def check_count(name: str, value: int) -> None:
    """A sampler's seed or epoch: an integer from 0 to 2**64 - 1 (what the Rust loader's
    permutation takes)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ValueError(f"dp_sampler: {name} must be an integer from 0 to 2**64 - 1, got {value!r}")


def dp_sampler(
    plan: Plan, dataset: Dataset[Any], mesh: DeviceMesh, *, shuffle: bool, seed: int = 0
) -> DpSampler:
    """A sampler over data-parallel replicas, found on ``mesh`` by the spec's name for
    the DP axis: every rank of a CP group gets the same indices (inference: in order;
    training: shuffled by seed and ``set_epoch``)."""
    return DpSampler(plan, dataset, mesh, shuffle=shuffle, seed=seed)


def to_device_mesh(
    plan: Plan, batch: Mapping[str, Any], mesh: DeviceMesh, device: torch.device
) -> dict[str, Any]:
    """A distributed batch (or single sample) from the mesh it was made on (a CPU mesh,
    or ``mesh`` itself) onto ``mesh`` on ``device``: the same placements, global shape
    and stride (a batch's DTensor already on ``mesh`` and ``device`` is kept as it is,
    blocks already on ``device`` are not copied); a single sample from a
    (cp0, cp1) mesh gains a leading batch axis of 1, and its metadata becomes one-item
    lists."""
    unbatched = mesh_dims(plan, mesh)[0] is None
    on_dp = placements(plan, dp=True)
    out: dict[str, Any] = {}
    for name, x in paths.flat(plan, batch).items():
        if not isinstance(x, DTensor):
            out[name] = [x] if unbatched else x
            continue
        local = x.to_local()
        if not unbatched and x.device_mesh is mesh and local.device == device:
            # Already where the model reads it (collated on the model's mesh).
            out[name] = x
            continue
        local = local.to(device)
        shape, where = tuple(x.shape), tuple(x.placements)
        if unbatched:
            local, shape, where = local.unsqueeze(0), (1, *shape), on_dp[name][1:]
        out[name] = as_dtensor(local, mesh, where, shape)
    return paths.nested(plan, out)
