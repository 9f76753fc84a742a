"""A domain-parallel plan's tables, and every number of one sample's layout on a domain
mesh: validated and laid out by featshard's executor, from the plan's native geometry."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement

from featshard import Feature, Plan, Semantic, blocks
from featshard.blocks import dtype_name, place
from featshard.distribute import placements
from featshard.errors import FeatureDistributionError

__all__ = ["DomainTables", "FeatureInfo", "SemanticInfo"]


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


class DomainTables:
    """A domain-parallel plan's tables and the geometry of a sample on its mesh."""

    def __init__(self, plan: Plan) -> None:
        if plan.uneven is None:
            raise ValueError(f"`{plan.module}`: not a domain-parallel plan (its mesh has CP axes {plan.mesh_axes})")
        self.plan = plan
        self.domain_axes: tuple[str, ...] = tuple(plan.mesh_axes)
        self.dp_axis: str | None = plan.dp_axis
        # Per domain axis: shards may be uneven (torch.chunk sizes) rather than padded.
        self.uneven: tuple[bool, ...] = tuple(plan.uneven)
        self.semantics = {name: _semantic_info(s) for name, s in plan.semantics.items()}
        self.features: dict[str, FeatureInfo] = {}
        self.parameters: dict[str, FeatureInfo] = {}
        self.outputs: dict[str, FeatureInfo] = {}
        on_mesh = placements(plan)
        for name, f in plan.features.items():
            to = self.parameters if f.parameter else self.outputs if f.output else self.features
            to[name] = _feature_info(f, on_mesh[name])
        self.metadata: tuple[str, ...] = tuple(plan.metadata)
        # Inputs whose role is a mask (0 or 1 only: the executor checks them).
        self.masks: tuple[str, ...] = tuple(
            n for n in self.features if plan.features[n].role == "mask"
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
        # The executor reads the sizes for the spec's mesh, one per axis, or refuses them.
        mesh = tuple(int(n) for n in mesh_sizes)
        try:
            placed = place(self.plan, inputs, mesh)
        except (ValueError, TypeError) as e:
            raise FeatureDistributionError(str(e)) from None
        return placed, placed.layout.sizes

    def check_shapes(self, shapes: Mapping[str, tuple[Sequence[int], torch.dtype]], mesh_sizes: Sequence[int]) -> dict[str, int]:
        """`check_inputs` on the inputs' shapes and dtypes alone (a file's header, say): the
        executor's checks that need no values, then the layout's on `mesh_sizes`."""
        named = {n: (dtype_name(d), [int(x) for x in s]) for n, (s, d) in shapes.items()}
        try:
            lengths = self.plan.check_shapes(named)
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
        return {name: tuple(shapes[name].global_) for name in self.features}

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
        local shapes of the ranks along that axis (sharing this rank's other coordinates),
        from the plan alone."""
        along = self.plan.sharding_shapes(name, list(shape), list(mesh_sizes), list(coord))
        return {m: tuple(tuple(s) for s in shapes) for m, shapes in along.items()}

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
        # An input already at its global shape is its padded layout (a domain plan moves
        # no item and remaps no value): only the others are written, so that a sample
        # that needs no padding is not copied.
        shapes = placed.global_shapes
        padded = placed.padded(names=[n for n in self.features if tuple(inputs[n].shape) != shapes[n]])
        return {
            n: padded.get(n, inputs[n]).to(device if device is not None else inputs[n].device)
            for n in self.features
        }

    def rank_blocks(
        self, inputs: Mapping[str, Any], mesh_sizes: Sequence[int], threads: int = 1
    ) -> list[dict[str, torch.Tensor]]:
        """Every domain rank's block of every input, row-major over the domain mesh, with
        no process group: what each rank's ShardTensor holds after `scatter`, written by
        featshard's byte executor (the Rust runtime's) from the sample's memory. Raises
        FeatureDistributionError naming the feature and axis at fault."""
        mesh = tuple(int(n) for n in mesh_sizes)
        try:
            placed = place(self.plan, inputs, mesh, threads=threads)
        except ValueError as e:
            raise FeatureDistributionError(str(e)) from None
        coords = itertools.product(*(range(n) for n in mesh))
        return [placed.blocks_at(c, threads) for c in coords]

    def domain_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """The domain sub-mesh of a (dp, domain...) or domain-only mesh."""
        names = mesh.mesh_dim_names or ()
        if tuple(names) == self.domain_axes:
            return mesh
        if not set(self.domain_axes) <= set(names):
            raise FeatureDistributionError(f"mesh axes {names} lack the domain axes {self.domain_axes}")
        return mesh[self.domain_axes]


def _semantic_info(s: Semantic) -> SemanticInfo:
    return SemanticInfo(s.sharded, s.batch, tuple(s.pad_mesh_axes), s.stride, s.halo)


def _feature_info(f: Feature, placements: tuple[Placement, ...]) -> FeatureInfo:
    return FeatureInfo(
        placements,
        tuple(f.splits),
        tuple(f.semantics),
        tuple(f.sizes),
        getattr(torch, f.dtype),
        f.pad_value,
    )
