"""ShardTensor scatter and gather of a domain-parallel plan (PhysicsNeMo).

One sample's spatial axes are split over the plan's domain mesh with PhysicsNeMo's
``ShardTensor``: uneven axes take ``torch.chunk`` pieces (no padding), the others are
padded to even shards. The batch axis must be 1 per domain group: scale the batch over
the data-parallel axis. :class:`Domain` reads its tables from the plan IR and every
number of the layout (chunk pieces, padded lengths, global shapes, windows, the shard
rule) from the plan's native geometry; a generated ``<module>.py`` binds one to its
plan file. Under torchrun::

    d = Domain(Plan("weather.yaml"))
    mesh = d.setup(domain=(...), ddp=...)                           # process group, device, mesh
    model = d.wrap_model(model.to(mesh_device(mesh)), mesh, "ddp")  # synced, wrapped
    s = d.scatter(sample if is_source else None, mesh)              # ShardTensors from one rank
    s = d.scatter_local(*d.safetensors_source(path), mesh)          # or each rank reads its part
    outputs = d.gather_outputs(model_outputs, s.lengths)            # full tensors

:meth:`Domain.check_gradients` runs a model serially and on the scattered inputs and
compares outputs, weight gradients and input gradients.
"""

from __future__ import annotations

import itertools
import math
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement, Replicate

from featshard import Plan, _native, blocks, chunk_sizes
from featshard.blocks import _BY_NAME, _DTYPES, place
from featshard.distribute import placements
from featshard.errors import FeatureDistributionError

__all__ = [
    "Domain",
    "FeatureDistributionError",
    "FeatureInfo",
    "Reader",
    "Scattered",
    "SemanticInfo",
    "adopt_process_group",
    "chunk_sizes",
    "mesh_device",
]




class SemanticInfo(NamedTuple):
    """What an axis semantic counts: sharded, the batch axis, or neither."""

    sharded: bool
    batch: bool
    # Domain axes whose sizes this semantic is padded to a multiple of (even shards).
    pad_mesh_axes: tuple[int, ...]
    # Every shard is a multiple of `stride` long and at least `halo` long.
    stride: int
    halo: int


class FeatureInfo(NamedTuple):
    """One input: its placements on the domain mesh and its axes."""

    placements: tuple[Placement, ...]
    # Per tensor axis: the domain mesh axis that splits it, or None.
    splits: tuple[int | None, ...]
    semantics: tuple[str | None, ...]
    # Per tensor axis: the fixed size of a channel axis, or None.
    channels: tuple[int | None, ...]
    dtype: torch.dtype
    pad: float | int | bool


class Scattered(NamedTuple):
    """One scattered sample: its ShardTensors (and metadata), and every semantic's real
    length, known on every rank (what `gather_outputs` cuts pads back to)."""

    inputs: dict[str, Any]
    lengths: dict[str, int]


# Writes one input's part `window` (a slice per axis, in the serial input's coordinates)
# into `out`, a view of this rank's block of the window's shape.
Reader = Callable[[str, tuple[slice, ...], torch.Tensor], None]


class Domain:
    """A domain-parallel plan's tables and its ShardTensor runtime."""

    def __init__(self, plan: Plan) -> None:
        ir = plan.ir
        mesh = ir["mesh"]
        if "domain" not in mesh:
            raise ValueError(f"`{plan.module}`: not a domain-parallel plan (its mesh has CP axes {mesh['cp']})")
        self.plan = plan
        self.domain_axes: tuple[str, ...] = tuple(mesh["cp"])
        self.dp_axis: str | None = mesh.get("dp")
        # Per domain axis: shards may be uneven (torch.chunk sizes) rather than padded.
        self.uneven: tuple[bool, ...] = tuple(mesh["domain"]["uneven"])
        self.semantics = {name: _semantic_info(s) for name, s in ir["semantics"].items()}
        self.features: dict[str, FeatureInfo] = {}
        self.parameters: dict[str, FeatureInfo] = {}
        self.outputs: dict[str, FeatureInfo] = {}
        metadata = []
        on_mesh = placements(plan)
        for name, f in ir["features"].items():
            if f["kind"] != "tensor":
                metadata.append(name)
                continue
            to = self.parameters if f.get("parameter") else self.outputs if f.get("output") else self.features
            to[name] = _feature_info(f, on_mesh[name])
        self.metadata: tuple[str, ...] = tuple(metadata)
        # Inputs whose role is a mask (0 or 1 only: the executor checks them).
        self.masks: tuple[str, ...] = tuple(
            n for n in self.features if ir["features"][n]["role"]["kind"] == "mask"
        )
        self.placements = {n: f.placements for n, f in self.features.items()}

    def check_inputs(self, inputs: Mapping[str, torch.Tensor], mesh_sizes: Sequence[int]) -> dict[str, int]:
        """Validates one sample for a domain mesh of `mesh_sizes`; returns every semantic's length.

        The checks and messages are featshard's executor's (`featshard shard` prints the
        same), raised as FeatureDistributionError naming the feature and axis: a missing or
        unknown input, a wrong rank, dtype or channel size, a batch axis that is not 1, two
        axes of one semantic with different lengths, a split axis shorter than its ranks
        (empty shards), a mask holding other than 0 and 1.
        """
        return self._place(inputs, mesh_sizes)[1]

    def _place(self, inputs: Mapping[str, Any], mesh_sizes: Sequence[int]) -> tuple[blocks.Placement, dict[str, int]]:
        """The sample validated and laid out by the executor, and its semantics' lengths."""
        mesh = self._mesh(mesh_sizes)
        try:
            placed = place(self.plan, inputs, mesh)
        except (ValueError, TypeError) as e:
            raise FeatureDistributionError(str(e)) from None
        return placed, dict(placed.layout["sizes"])

    def _mesh(self, mesh_sizes: Sequence[int]) -> tuple[int, int]:
        """A domain mesh of this plan's axes, as the executor takes it (a second axis of 1)."""
        sizes = tuple(int(n) for n in mesh_sizes)
        if len(sizes) != len(self.domain_axes):
            raise FeatureDistributionError(
                f"a domain mesh of {len(self.domain_axes)} axes {self.domain_axes}, got sizes {sizes}"
            )
        return (sizes[0], sizes[1] if len(sizes) > 1 else 1)

    def check_shapes(self, shapes: Mapping[str, tuple[Sequence[int], torch.dtype]], mesh_sizes: Sequence[int]) -> dict[str, int]:
        """`check_inputs` on the inputs' shapes and dtypes alone (a file's header, say): the
        executor's checks that need no values, then the layout's on `mesh_sizes`."""
        self._mesh(mesh_sizes)
        named = {n: (_DTYPES.get(d, str(d).removeprefix("torch.")), [int(x) for x in s]) for n, (s, d) in shapes.items()}
        try:
            lengths = self.plan._native.check_shapes(named)
        except ValueError as e:
            raise FeatureDistributionError(str(e)) from None
        self.global_shapes(lengths, mesh_sizes)
        return lengths

    def padded_length(self, semantic: str, length: int, mesh_sizes: Sequence[int]) -> int:
        """The length a semantic's axes are padded to (itself on uneven axes): a multiple of
        the lcm of the mesh sizes that split it times its stride, at least its halo per shard."""
        return self.plan.padded_length(semantic, length, mesh_sizes)

    def global_shapes(self, lengths: Mapping[str, int], mesh_sizes: Sequence[int]) -> dict[str, tuple[int, ...]]:
        """Every input's ShardTensor global shape (padded on even-shard axes) for a sample
        of semantic lengths `lengths`. Raises FeatureDistributionError naming the feature
        and axis when an uneven axis's `torch.chunk` pieces would leave a shard empty or
        break its semantic's stride or halo."""
        p = self.plan
        try:
            shapes = p.shapes(p.layout(tuple(mesh_sizes), dict(lengths)), list(self.features))
        except ValueError as e:
            raise FeatureDistributionError(str(e)) from None
        return {name: tuple(shapes[name]["global_"]) for name in self.features}

    def global_shape(self, name: str, lengths: Mapping[str, int], mesh_sizes: Sequence[int]) -> tuple[int, ...]:
        """The ShardTensor's global shape of one input (padded on even-shard axes)."""
        return self.global_shapes(lengths, mesh_sizes)[name]

    def local_window(
        self,
        name: str, shape: Sequence[int], mesh_sizes: Sequence[int], coord: Sequence[int]
    ) -> tuple[tuple[int, int], ...]:
        """The part of the global (padded) `shape` the rank at domain-mesh `coord` holds:
        `(start, length)` per axis, from the plan alone."""
        return tuple(self.plan.domain_window(name, shape, mesh_sizes, coord))

    def local_shape(self, name: str, shape: Sequence[int], mesh_sizes: Sequence[int], coord: Sequence[int]) -> tuple[int, ...]:
        """The local shape of the rank at domain-mesh `coord`, from the plan alone."""
        return tuple(n for _, n in self.local_window(name, shape, mesh_sizes, coord))

    def sharding_shapes(
        self,
        name: str, shape: Sequence[int], mesh_sizes: Sequence[int], coord: Sequence[int]
    ) -> dict[int, tuple[tuple[int, ...], ...]]:
        """ShardTensor's layout as the rank at `coord` sees it: per sharded mesh axis, the
        local shapes of the ranks along that axis (sharing this rank's other coordinates)."""
        out: dict[int, tuple[tuple[int, ...], ...]] = {}
        for m, p in enumerate(self.features[name].placements):
            if isinstance(p, Replicate):
                continue
            along = []
            for k in range(mesh_sizes[m]):
                c = list(coord)
                c[m] = k
                along.append(self.local_shape(name, shape, mesh_sizes, c))
            out[m] = tuple(along)
        return out

    def pad_inputs(
        self,
        inputs: Mapping[str, torch.Tensor], mesh_sizes: Sequence[int], device: torch.device | None = None
    ) -> dict[str, torch.Tensor]:
        """Every input at its global shape, written by the executor: even-shard axes padded
        at the end with the pad value; on `device` (the input's own when None)."""
        return self._padded(self._place(inputs, mesh_sizes)[0], inputs, device)

    def _padded(
        self, placed: blocks.Placement, inputs: Mapping[str, torch.Tensor], device: torch.device | None
    ) -> dict[str, torch.Tensor]:
        padded = placed.padded()
        return {n: padded[n].to(device if device is not None else inputs[n].device) for n in self.features}

    def rank_blocks(
        self, inputs: Mapping[str, Any], mesh_sizes: Sequence[int], threads: int = 1
    ) -> list[dict[str, torch.Tensor]]:
        """Every domain rank's block of every input, row-major over the domain mesh, with
        no process group: what each rank's ShardTensor holds after `scatter`, written by
        featshard's byte executor (the Rust runtime's) from the sample's memory. Raises
        FeatureDistributionError naming the feature and axis at fault."""
        mesh = self._mesh(mesh_sizes)
        try:
            placed = place(self.plan, inputs, mesh, threads=threads)
        except ValueError as e:
            raise FeatureDistributionError(str(e)) from None
        coords = itertools.product(range(mesh[0]), range(mesh[1]))
        return [placed.blocks_at(c, threads) for c in coords]

    def domain_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """The domain sub-mesh of a (dp, domain...) or domain-only mesh."""
        names = mesh.mesh_dim_names or ()
        if tuple(names) == self.domain_axes:
            return mesh
        if not set(self.domain_axes) <= set(names):
            raise FeatureDistributionError(f"mesh axes {names} lack the domain axes {self.domain_axes}")
        return mesh[self.domain_axes]

    def scatter_inputs(
        self,
        inputs: Mapping[str, torch.Tensor] | None,
        mesh: DeviceMesh,
        requires_grad: bool | Mapping[str, bool] = False,
    ) -> dict[str, Any]:
        """`self.scatter(inputs, mesh, requires_grad).inputs`: the ShardTensors alone."""
        return self.scatter(inputs, mesh, requires_grad).inputs

    def scatter(
        self,
        inputs: Mapping[str, torch.Tensor] | None,
        mesh: DeviceMesh,
        requires_grad: bool | Mapping[str, bool] = False,
    ) -> Scattered:
        """Scatters one sample over the domain mesh as ShardTensors at `PLACEMENTS`.

        The domain group's source rank (its first rank) passes `inputs`, the others None.
        The source validates and pads (onto the mesh's device), then broadcasts ok (with every global shape and the
        metadata, which every rank gets) or the error; every rank raises the same
        FeatureDistributionError. Each input then goes
        through `physicsnemo.domain_parallel.scatter_tensor` with the source's global rank,
        the explicit global shape and dtype (so no shape exchange per tensor), and
        `requires_grad` (never set in place afterwards: that would not reach the ShardTensor).
        Local shapes are checked against the plan's.
        """
        from physicsnemo.domain_parallel import scatter_tensor  # type: ignore[import-untyped]

        dmesh = self.domain_mesh(mesh)
        sizes = tuple(int(n) for n in dmesh.mesh.shape)
        src = int(dmesh.mesh.flatten()[0])
        device = mesh_device(dmesh)
        _check_manager_device(device)
        group = _domain_group(dmesh)
        padded: dict[str, torch.Tensor] = {}
        status: list[Any] = [None]
        if dist.get_rank() == src:
            try:
                if inputs is None:
                    raise FeatureDistributionError("the source rank was given no inputs")
                placed, lengths = self._place(inputs, sizes)
                # On the mesh's device: a CPU sample from a DataLoader cannot go through NCCL.
                padded = self._padded(placed, inputs, device)
                # Metadata and lengths ride with the shapes: every rank needs them.
                meta = {n: inputs[n] for n in self.metadata if n in inputs}
                status[0] = ("ok", ({n: tuple(x.shape) for n, x in padded.items()}, meta, lengths))
            except FeatureDistributionError as e:
                status[0] = ("error", str(e))
        dist.broadcast_object_list(status, src=src, group=group)
        kind, payload = status[0]
        if kind != "ok":
            raise FeatureDistributionError(str(payload))
        shapes: dict[str, tuple[int, ...]] = payload[0]
        coord = [int(c) for c in (dmesh.get_coordinate() or [0] * len(sizes))]
        out: dict[str, Any] = {}
        for name in sorted(self.features):
            info = self.features[name]
            grad = requires_grad if isinstance(requires_grad, bool) else bool(requires_grad.get(name, False))
            st = scatter_tensor(
                padded.get(name),
                src,
                dmesh,
                placements=info.placements,
                global_shape=torch.Size(shapes[name]),
                dtype=info.dtype,
                requires_grad=grad and info.dtype.is_floating_point,
            )
            want = self.local_shape(name, shapes[name], sizes, coord)
            if tuple(st.to_local().shape) != want:
                raise FeatureDistributionError(
                    f"feature `{name}`: ShardTensor holds {tuple(st.to_local().shape)} here, the plan says {want}"
                )
            out[name] = st
        out.update(payload[1])
        return Scattered(out, dict(payload[2]))

    def scatter_local(
        self,
        read: Reader,
        lengths: Mapping[str, int],
        mesh: DeviceMesh,
        requires_grad: bool | Mapping[str, bool] = False,
        metadata: Mapping[str, Any] | None = None,
    ) -> Scattered:
        """Scatters one sample with no source rank: every rank reads only its own part.

        Every rank passes the same `lengths` (every semantic's real length; from
        `safetensors_source` or the featurizer's index) and a `read` that writes the real
        part of its window of an input into its block (pads are never read: they are filled
        here; with a tensor at hand, `read` is `out.copy_(x[window])`). Each
        local block becomes a ShardTensor through `ShardTensor.from_local` with the planned
        `sharding_shapes` (no shape exchange, no broadcast of the sample). An error on any
        rank (a bad length, a read that fails) is raised on every rank of the domain group,
        after one exchange of the messages.
        """
        from physicsnemo.domain_parallel import ShardTensor

        dmesh = self.domain_mesh(mesh)
        sizes = tuple(int(n) for n in dmesh.mesh.shape)
        device = mesh_device(dmesh)
        coord = [int(c) for c in (dmesh.get_coordinate() or [0] * len(sizes))]
        blocks: dict[str, torch.Tensor] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        error: str | None = None
        try:
            _check_manager_device(device)
            self._check_lengths(lengths, sizes)
            shapes = self.global_shapes(lengths, sizes)
            for name in sorted(self.features):
                blocks[name] = self._read_block(read, name, lengths, shapes[name], sizes, coord, device)
        except FeatureDistributionError as e:
            error = str(e)
        errors: list[Any] = [None] * int(dmesh.mesh.numel())
        dist.all_gather_object(errors, error, group=_domain_group(dmesh))
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise FeatureDistributionError(str(first))
        out: dict[str, Any] = {}
        for name in sorted(self.features):
            info = self.features[name]
            grad = requires_grad if isinstance(requires_grad, bool) else bool(requires_grad.get(name, False))
            with torch.no_grad():
                st = ShardTensor.from_local(
                    blocks[name], dmesh, info.placements,
                    sharding_shapes=_as_lists(self.sharding_shapes(name, shapes[name], sizes, coord)),
                )
            # A leaf, as scatter's are: gradients reach the ShardTensor itself.
            out[name] = st.detach().requires_grad_(grad and info.dtype.is_floating_point)
        out.update(metadata or {})
        return Scattered(out, {s: int(n) for s, n in lengths.items()})

    def _check_lengths(self, lengths: Mapping[str, int], mesh_sizes: Sequence[int]) -> None:
        """The lengths every input's shape would have pass `check_shapes`."""
        missing = sorted(s for f in self.features.values() for s in f.semantics if s is not None and s not in lengths)
        if missing:
            raise FeatureDistributionError(f"no length given for semantics {sorted(set(missing))}")
        self.check_shapes(
            {
                n: (tuple(lengths[s] if s is not None else int(c or 0) for s, c in zip(f.semantics, f.channels)), f.dtype)
                for n, f in self.features.items()
            },
            mesh_sizes,
        )

    def _read_block(
        self,
        read: Reader,
        name: str,
        lengths: Mapping[str, int],
        shape: tuple[int, ...],
        mesh_sizes: Sequence[int],
        coord: Sequence[int],
        device: torch.device,
    ) -> torch.Tensor:
        """This rank's block of one input: its real part read in place, the rest the pad value."""
        info = self.features[name]
        window = self.local_window(name, shape, mesh_sizes, coord)
        real = []
        for (start, n), sem, c in zip(window, info.semantics, info.channels):
            end = min(start + n, lengths[sem] if sem is not None else int(c or 0))
            real.append(slice(start, max(start, end)))
        want = tuple(r.stop - r.start for r in real)
        all_real = want == tuple(n for _, n in window)
        block = torch.empty(tuple(n for _, n in window), dtype=info.dtype, device=device)
        if not all_real:
            block.fill_(info.pad)
        if 0 in want:
            return block
        try:
            read(name, tuple(real), block[tuple(slice(0, n) for n in want)])
        except Exception as e:  # noqa: BLE001 - a reader's error becomes every rank's
            raise FeatureDistributionError(
                f"feature `{name}`: reading window {[(r.start, r.stop) for r in real]} failed: {type(e).__name__}: {e}"
            ) from None
        return block

    def safetensors_source(self, path: str | os.PathLike[str]) -> tuple[Reader, dict[str, int]]:
        """A reader of one serial sample's safetensors file, and the sample's lengths from its
        header, checked as `check_inputs` checks tensors (mesh rules aside, which
        `scatter_local` checks). Each rank reads only its own part of every input, with
        positioned reads straight into its blocks: no memory map, no whole tensor."""
        try:
            found, _ = _native.read_header(os.fspath(path))
        except ValueError as e:
            raise FeatureDistributionError(str(e)) from None
        entries = {n: _Entry(_BY_NAME[d], tuple(shape), at) for n, d, shape, at in found}
        shapes = {n: (e.shape, e.dtype) for n, e in entries.items()}
        lengths = self.check_shapes(shapes, (1,) * len(self.domain_axes))
        fd = os.open(os.fspath(path), os.O_RDONLY)

        def read(name: str, window: tuple[slice, ...], out: torch.Tensor) -> None:
            _read_window(fd, entries[name], window, out)

        weakref.finalize(read, os.close, fd)
        return read, lengths

    def gather_outputs(
        self,
        outputs: Mapping[str, Any],
        lengths: Mapping[str, int] | None = None,
        semantics: Mapping[str, Sequence[str | None]] | None = None,
    ) -> dict[str, Any]:
        """`full_tensor()` of every ShardTensor (or DTensor) output on every rank; other values
        pass through. With the sample's `lengths` (from `check_inputs`), padded axes are cut
        back to them: the axes of the spec's outputs (`output: true`) and features, and those
        of any other output whose axis semantics `semantics` gives, one per axis (None for a
        channel axis), e.g. a model's prediction `{"pred": ("batch", None, "lat", "lon")}`."""
        out: dict[str, Any] = {}
        for name, v in outputs.items():
            full = v.full_tensor() if hasattr(v, "full_tensor") else v
            if semantics is not None and name in semantics:
                axes: Sequence[str | None] | None = tuple(semantics[name])
            else:
                declared = self.outputs.get(name) or self.features.get(name)
                axes = declared.semantics if declared is not None else None
            if lengths is not None and axes is not None and isinstance(full, torch.Tensor):
                if len(axes) != full.dim():
                    raise FeatureDistributionError(
                        f"output `{name}`: {len(axes)} axis semantics for shape {tuple(full.shape)}"
                    )
                for d, s in enumerate(axes):
                    if s is not None and s not in self.semantics:
                        raise FeatureDistributionError(f"output `{name}`, axis {d}: semantic `{s}` is not declared")
                    if s is not None and s in lengths:
                        full = full.narrow(d, 0, lengths[s])
            out[name] = full
        return out

    def setup(
        self,
        domain: Sequence[int],
        ddp: int = 1,
        init_method: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        timeout: timedelta | None = None,
    ) -> DeviceMesh:
        """Starts this process's part of a run and returns its (dp, domain...) mesh.

        With CUDA: this process's GPU (`LOCAL_RANK`) made current, NCCL; under torchrun with
        no `init_method`, through PhysicsNeMo's own `DistributedManager.initialize()`. Without
        CUDA: gloo (PhysicsNeMo's initialiser cannot start a CPU group: see
        `adopt_process_group`). A process group started beforehand is kept. The mesh is
        built with the spec's axis names, `ddp` replicas of the domain mesh `domain`, and
        checked against the world size.
        """
        from torch.distributed.device_mesh import init_device_mesh

        sizes = tuple(int(n) for n in domain)
        if len(sizes) != len(self.domain_axes) or min(sizes, default=1) < 1 or ddp < 1:
            raise FeatureDistributionError(f"domain sizes {sizes} and ddp {ddp} for the domain axes {self.domain_axes}")
        if ddp > 1 and self.dp_axis is None:
            raise FeatureDistributionError(f"ddp {ddp}, but the spec names no data-parallel mesh axis (`mesh.dp`)")
        _start_group(init_method, rank, world_size, timeout)
        world = dist.get_world_size()
        if world != ddp * math.prod(sizes):
            raise FeatureDistributionError(
                f"world size {world}, but ddp {ddp} x domain {sizes} {self.domain_axes} needs {ddp * math.prod(sizes)} ranks"
            )
        dp = self.dp_axis
        names: tuple[str, ...] = ((dp,) if dp is not None else ()) + tuple(self.domain_axes)
        shape = ((ddp,) if dp is not None else ()) + sizes
        return init_device_mesh("cuda" if torch.cuda.is_available() else "cpu", shape, mesh_dim_names=names)

    def wrap_model(self, model: torch.nn.Module, mesh: DeviceMesh, strategy: str = "none") -> torch.nn.Module:
        """Readies a model for the (dp, domain...) mesh: its plain parameters and buffers are
        broadcast over every domain axis (each domain rank starts from the same weights: DDP
        syncs the data-parallel axis only, FSDP2 none), then `strategy`: "none", "ddp"
        (DistributedDataParallel over the data-parallel group) or "fsdp2" (`fully_shard` on
        the data-parallel mesh, after the sync). On the FSDP2 path only, the spec's
        `self.parameters` (spatial parameters: positional embeddings, RoPE tables) are first
        sharded over the domain mesh as DTensors at their placements; the others, and all
        of them on the other paths, stay plain (ShardTensor promotes them in each op)."""
        from physicsnemo.domain_parallel import sync_module_over_mesh

        names = tuple(mesh.mesh_dim_names or ())
        for axis in self.domain_axes:
            if axis in names and mesh[axis].size() > 1:
                sync_module_over_mesh(model, mesh[axis])
        if strategy == "none":
            return model
        dp = self.dp_axis
        if dp is None or dp not in names:
            raise FeatureDistributionError(f"strategy `{strategy}` needs the data-parallel mesh axis `{dp}` in {names}")
        if strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model, process_group=mesh[dp].get_group())
        if strategy == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            self.shard_parameters(model, mesh)
            fully_shard(model, mesh=mesh[dp])
            return model
        raise FeatureDistributionError(f"unknown strategy `{strategy}`: expected none, ddp or fsdp2")

    def shard_parameters(self, model: torch.nn.Module, mesh: DeviceMesh) -> list[str]:
        """Replaces every parameter of `model` that the spec declares (`self.parameters`, matched
        by the last part of its dotted name) by a DTensor on the domain mesh at the declared
        placements, contiguous (FSDP2 refuses others); returns their dotted names. Each is
        checked like an input (rank, dtype, channel sizes, a split axis no shorter than its
        ranks); a declared parameter the model lacks is refused by name."""
        from torch.distributed.tensor import distribute_tensor

        dmesh = self.domain_mesh(mesh)
        sizes = tuple(int(n) for n in dmesh.mesh.shape)
        found: dict[str, list[str]] = {name: [] for name in self.parameters}
        for dotted, p in list(model.named_parameters()):
            *path, attr = dotted.split(".")
            info = self.parameters.get(attr)
            if info is None:
                continue
            self._check_parameter(dotted, attr, p, info, sizes)
            owner = model.get_submodule(".".join(path))
            shard = distribute_tensor(p.detach().contiguous(), dmesh, list(info.placements))
            setattr(owner, attr, torch.nn.Parameter(shard, requires_grad=p.requires_grad))
            found[attr].append(dotted)
        missing = sorted(n for n, at in found.items() if not at)
        if missing:
            raise FeatureDistributionError(f"parameters {missing} of the spec are not in the model")
        return [d for at in found.values() for d in at]

    def _check_parameter(self, dotted: str, attr: str, p: torch.Tensor, info: FeatureInfo, sizes: Sequence[int]) -> None:
        what = f"parameter `{attr}` (`{dotted}`)"
        if p.dim() != len(info.semantics):
            raise FeatureDistributionError(f"{what}: expected {len(info.semantics)} axes, got shape {tuple(p.shape)}")
        if p.dtype != info.dtype:
            raise FeatureDistributionError(f"{what}: expected dtype {info.dtype}, got {p.dtype}")
        for d, (sem, size, m) in enumerate(zip(info.semantics, info.channels, info.splits)):
            n = int(p.shape[d])
            label = f"{what}, axis {d} ({sem if sem is not None else 'channel'})"
            if sem is None and size is not None and n != size:
                raise FeatureDistributionError(f"{label}: expected size {size}, got {n}")
            if m is not None and n < sizes[m]:
                raise FeatureDistributionError(f"{label}: {n} items over {sizes[m]} ranks of `{self.domain_axes[m]}`")

    def check_gradients(
        self,
        model_factory: Callable[[], torch.nn.Module],
        forward: Callable[[torch.nn.Module, Mapping[str, Any]], torch.Tensor],
        loss: Callable[[torch.Tensor], torch.Tensor],
        sample: Mapping[str, Any],
        mesh: DeviceMesh,
        strategy: str = "none",
        atol: float = 1e-5,
        rtol: float = 1e-4,
    ) -> None:
        """Gradient parity of one sample, checked on every rank with TF32 off.

        `forward(model, inputs)` then `loss(output)` run serially on the padded sample and,
        through `self.wrap_model(..., strategy)`, on its scattered ShardTensors. The output, the
        loss, every weight gradient and every floating-point input's gradient (which keeps
        the input's placements) must agree within `atol` + `rtol`; on the FSDP2 path the
        spec's `self.parameters` must sit at their placements on the domain. Every rank passes the
        same full `sample` (data-parallel replicas too, so that averaging keeps the serial
        gradients); `model_factory` must build the same model on every call (seed it).
        Raises AssertionError naming what differs.
        """
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dmesh = self.domain_mesh(mesh)
        sizes = tuple(int(n) for n in dmesh.mesh.shape)
        device = mesh_device(dmesh)
        serial: dict[str, Any] = {n: sample[n] for n in self.metadata if n in sample}
        for name, x in self.pad_inputs(sample, sizes, device).items():
            serial[name] = x.detach().clone().requires_grad_(x.dtype.is_floating_point)
        reference = model_factory().to(device)
        want = forward(reference, serial)
        want_loss = loss(want)
        torch.autograd.backward(want_loss)
        model = self.wrap_model(model_factory().to(device), mesh, strategy)
        is_source = dist.get_rank() == int(dmesh.mesh.flatten()[0])
        inputs = self.scatter(sample if is_source else None, mesh, requires_grad=True).inputs
        got = forward(model, inputs)
        got_loss = loss(got)
        torch.autograd.backward(got_loss)
        _close("output", got, want, atol, rtol)
        _close("loss", got_loss, want_loss, atol, rtol)
        inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
        for (name, p), (_, q) in zip(inner.named_parameters(), reference.named_parameters()):
            declared = self.parameters.get(name.split(".")[-1])
            if strategy == "fsdp2" and declared is not None:
                on_domain = tuple(getattr(p, "placements", ()))[-len(self.domain_axes) :]
                if on_domain != declared.placements:
                    raise AssertionError(f"parameter `{name}`: at {on_domain} on the domain, not {declared.placements}")
            if q.grad is None or p.grad is None:
                raise AssertionError(f"weight `{name}`: no gradient ({'distributed' if p.grad is None else 'serial'})")
            _close(f"weight `{name}` gradient", p.grad, q.grad, atol, rtol)
        for name, x in serial.items():
            if not isinstance(x, torch.Tensor) or not x.requires_grad or x.grad is None:
                continue
            g = inputs[name].grad
            if g is None:
                raise AssertionError(f"input `{name}`: no gradient on the ShardTensor")
            if tuple(g.placements) != self.features[name].placements:
                raise AssertionError(f"input `{name}`: gradient at {tuple(g.placements)}, not {self.features[name].placements}")
            _close(f"input `{name}` gradient", g, x.grad, atol, rtol)




def mesh_device(mesh: DeviceMesh) -> torch.device:
    """The device a mesh's tensors live on: this process's current GPU for a CUDA mesh."""
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def _check_manager_device(device: torch.device) -> None:
    """ShardTensor allocates on DistributedManager's device: it must be the mesh's."""
    # PhysicsNeMo ships no type information.
    from physicsnemo.distributed import DistributedManager  # type: ignore[import-untyped]

    manager = DistributedManager().device
    if torch.device(manager) != device:
        raise FeatureDistributionError(
            f"PhysicsNeMo's DistributedManager allocates on {manager}, but the mesh is on {device}: "
            "start with setup(), or call adopt_process_group(device) after torch.cuda.set_device"
        )


def _domain_group(dmesh: DeviceMesh) -> Any:
    """The group scatter_tensor itself uses for this mesh (cached by PhysicsNeMo)."""
    from physicsnemo.distributed import DistributedManager

    return DistributedManager().get_mesh_group(dmesh)


def _as_lists(shapes: Mapping[int, Sequence[tuple[int, ...]]]) -> dict[int, list[tuple[int, ...]]]:
    return {m: list(v) for m, v in shapes.items()}


class _Entry(NamedTuple):
    """One tensor of a safetensors file: dtype, shape, where its data starts."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int


def _read_window(fd: int, e: _Entry, window: tuple[slice, ...], out: torch.Tensor) -> None:
    """Reads `window` of a C-ordered tensor in a file into `out` (of the window's shape):
    one positioned read per run that is contiguous in both the file and `out`."""
    if out.dim() == 0 or out.stride(-1) != 1 or out.device.type != "cpu":
        part = torch.empty(out.shape, dtype=out.dtype)
        _read_window(fd, e, window, part)
        out.copy_(part)
        return
    stride = [math.prod(e.shape[d + 1 :]) for d in range(len(e.shape))]
    k, run = len(e.shape), 1
    while k > 0 and out.stride(k - 1) == run:
        k -= 1
        n = window[k].stop - window[k].start
        run *= n
        if n != e.shape[k]:
            break
    item = out.element_size()
    raw = out.view(torch.uint8).numpy()
    for idx in itertools.product(*(range(window[d].stop - window[d].start) for d in range(k))):
        at = sum((window[d].start + i) * stride[d] for d, i in enumerate(idx))
        at += sum(window[d].start * stride[d] for d in range(k, len(e.shape)))
        dest = raw[idx]
        got = os.preadv(fd, [dest], e.offset + at * item)
        if got != run * item:
            raise OSError(f"short read: {got} of {run * item} bytes")


def _start_group(init_method: str | None, rank: int | None, world_size: int | None, timeout: timedelta | None) -> None:
    """The process group and PhysicsNeMo's manager, this process's GPU current (`setup`)."""
    from physicsnemo.distributed import DistributedManager

    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        if cuda and init_method is None and "RANK" in os.environ:
            DistributedManager.initialize()
        else:
            device = _local_device(rank) if cuda else None
            if device is not None:
                torch.cuda.set_device(device)
            dist.init_process_group(
                "nccl" if cuda else "gloo", init_method=init_method, device_id=device,
                rank=-1 if rank is None else rank, world_size=-1 if world_size is None else world_size,
                timeout=timeout,
            )
    if not DistributedManager.is_initialized() or not DistributedManager().distributed:
        adopt_process_group(_local_device(dist.get_rank()) if cuda else None)


def _local_device(rank: int | None) -> torch.device:
    local = os.environ.get("LOCAL_RANK")
    index = int(local) if local is not None else (rank or 0) % max(1, torch.cuda.device_count())
    return torch.device("cuda", index)


def adopt_process_group(device: torch.device | None = None) -> None:
    """Registers an initialised torch.distributed default group with PhysicsNeMo's
    `DistributedManager`, which `scatter_tensor` reads; `device` (this process's current
    GPU with CUDA, else the CPU) becomes the current device and the manager's.

    `DistributedManager.initialize()` passes `device_id=cpu` to `init_process_group` on a
    machine without CUDA, which torch 2.13 rejects, and PhysicsNeMo has no public way to
    register a group started otherwise: so this writes the manager's state, the fields
    its own properties read (a PhysicsNeMo that renames them fails here, by name).
    `setup()` calls it on CPU only.
    """
    from physicsnemo.distributed import DistributedManager

    if not dist.is_initialized():
        raise RuntimeError("adopt_process_group: call torch.distributed.init_process_group first")
    cuda = torch.cuda.is_available()
    dev = device or (torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    state = {
        "_is_initialized": True,
        "_distributed": True,
        "_rank": dist.get_rank(),
        "_world_size": dist.get_world_size(),
        "_local_rank": dev.index if dev.index is not None else 0,
        "_device": dev,
        "_cuda": dev.type == "cuda",
        "_initialization_method": "env",
    }
    unknown = [k for k in ("rank", "world_size", "device", "distributed") if not hasattr(DistributedManager, k)]
    if unknown:
        raise RuntimeError(f"adopt_process_group: this PhysicsNeMo's DistributedManager has no {unknown}")
    DistributedManager._shared_state.update(state)
    _register_shard_patches()


def _register_shard_patches() -> None:
    """PhysicsNeMo registers its shard-aware ops (the convolutions that exchange halos
    among them) when it is imported, but only where CUDA is available: on CPU ranks a
    convolution would then run on each shard alone, without its halo. Registered here
    where CUDA is not (the modules register on first import only)."""
    import physicsnemo.domain_parallel as pdp  # type: ignore[import-untyped]

    if not torch.cuda.is_available():
        pdp.register_custom_ops()


def _full(x: Any) -> Any:
    return x.full_tensor() if hasattr(x, "full_tensor") else x


def _close(what: str, got: Any, want: torch.Tensor, atol: float, rtol: float) -> None:
    got = _full(got).detach()
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, serially {tuple(want.shape)}")
    if not torch.allclose(got, want.detach(), atol=atol, rtol=rtol):
        err = float((got - want.detach()).abs().max())
        raise AssertionError(f"{what}: differs from the serial run by up to {err:.3g}")


def _semantic_info(s: Mapping[str, Any]) -> SemanticInfo:
    padding = s["padding"]
    pad_axes = tuple(padding["mesh_axes"]) if padding["kind"] == "multiple" else ()
    return SemanticInfo(bool(s["sharded"]), bool(s.get("batch", False)), pad_axes,
                        max(1, int(s.get("stride", 1))), int(s.get("halo", 0)))


def _feature_info(f: Mapping[str, Any], placements: tuple[Placement, ...]) -> FeatureInfo:
    axes = f["axes"]
    return FeatureInfo(
        placements,
        tuple(a["split"]["mesh_axis"] if a["split"]["kind"] != "whole" else None for a in axes),
        tuple(a["semantic"] for a in axes),
        tuple(a["size"] for a in axes),
        getattr(torch, f["dtype"]),
        f["pad_value"],
    )
