"""One sample's ShardTensors on a domain mesh: scattered from a source rank, or read by
every rank in its own part; and full outputs gathered back."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from featshard import _native
from featshard.blocks import torch_dtype
from featshard.distribute import mesh_terms
from featshard.domain.tables import DomainTables
from featshard.errors import (
    FeatureDistributionError,
    Status,
    agree,
    collective,
    status_of,
)

__all__ = ["DomainScatter", "Reader", "Scattered", "mesh_device"]


class Scattered(NamedTuple):
    """One scattered sample: its ShardTensors (and metadata), and every semantic's real
    length, known on every rank (what `gather_outputs` cuts pads back to)."""

    inputs: dict[str, Any]
    lengths: dict[str, int]


# Writes one input's part `window` (a slice per axis, in the serial input's coordinates)
# into `out`, a view of this rank's block of the window's shape.
Reader = Callable[[str, tuple[slice, ...], torch.Tensor], None]


class DomainScatter(DomainTables):
    """Scatter and gather of a domain-parallel plan's samples."""

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
        The source validates and pads (onto the mesh's device); the domain group agrees on
        it as every distribution does (its error, or ranks that disagree on the spec or
        the mesh, raised on every rank), then the source broadcasts every global shape and
        the metadata, which every rank gets. Each input then goes
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
        outcome: Any = None
        failed: Status | None = None
        if dist.get_rank() == src:
            try:
                if inputs is None:
                    raise FeatureDistributionError("the source rank was given no inputs")
                placed, lengths = self._place(inputs, sizes)
                # On the mesh's device: a CPU sample from a DataLoader cannot go through NCCL.
                padded = self._padded(placed, inputs, device)
                # Metadata and lengths ride with the shapes: every rank needs them.
                meta = {n: inputs[n] for n in self.metadata if n in inputs}
                outcome = ({n: tuple(x.shape) for n, x in padded.items()}, meta, lengths)
            except Exception as e:  # noqa: BLE001 - every error reaches every rank: none waits
                failed = status_of(e)
        # The one agreement (the source's failure, the same spec and mesh everywhere),
        # then the source's shapes, metadata and lengths, which every rank needs.
        terms = mesh_terms(self.plan, dmesh, None, 0)
        agree(failed, group, terms=terms, device=device, what="agreeing on the domain sample")
        box: list[Any] = [outcome]
        collective(f"the sample's shapes from source rank {src}", group,
                   partial(dist.broadcast_object_list, box, src=src, group=group))
        payload = box[0]
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
        failed: Status | None = None
        try:
            _check_manager_device(device)
            self._check_lengths(lengths, sizes)
            shapes = self.global_shapes(lengths, sizes)
            for name in sorted(self.features):
                blocks[name] = self._read_block(read, name, lengths, shapes[name], sizes, coord, device)
        except FeatureDistributionError as e:
            failed = status_of(e)
        agree(failed, _domain_group(dmesh), terms=mesh_terms(self.plan, dmesh), device=device,
              what="agreeing on the domain sample's parts")
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
        """The shapes every input has at these lengths (the executor's) pass
        `check_shapes`."""
        try:
            shapes = self.plan.input_shapes(dict(lengths))
        except ValueError as e:
            raise FeatureDistributionError(str(e)) from None
        self.check_shapes({n: (s, torch_dtype(d)) for n, (d, s) in shapes.items()}, mesh_sizes)

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
        real = [slice(a, b) for a, b in self.plan.real_window(name, list(window), dict(lengths))]
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
        `scatter_local` checks). Each rank reads only its own part of every input: the
        executor's positioned reads straight into its blocks (a contiguous CPU block; any
        other through one on the host), no memory map, no whole tensor."""
        try:
            reader = _native.WindowReader(os.fspath(path))
        except ValueError as e:
            raise FeatureDistributionError(str(e)) from None
        shapes = {n: (tuple(shape), torch_dtype(d)) for n, (d, shape) in reader.tensors.items()}
        lengths = self.check_shapes(shapes, (1,) * len(self.domain_axes))

        def read(name: str, window: tuple[slice, ...], out: torch.Tensor) -> None:
            bounds = [(w.start, w.stop) for w in window]
            if out.is_contiguous() and out.device.type == "cpu":
                reader.read(name, bounds, out.__dlpack__())
                return
            part = torch.empty(out.shape, dtype=out.dtype)
            reader.read(name, bounds, part.__dlpack__())
            out.copy_(part)

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
            if lengths is not None and isinstance(full, torch.Tensor):
                axes = None if semantics is None or name not in semantics else semantics[name]
                try:
                    real = self.plan.real_shape(name, full.shape, dict(lengths), axes)
                except ValueError as e:
                    raise FeatureDistributionError(str(e)) from None
                if real is not None:
                    full = full[tuple(slice(0, n) for n in real)]
            out[name] = full
        return out


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
