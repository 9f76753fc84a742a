"""Every rank's blocks of a sample, made by featshard's byte executor on torch tensors.

The sample is validated and placed in Rust (the executor ``featshard shard`` and the
tch runtime share), reading the tensors' own memory through DLPack; each block is then
written straight into a tensor allocated for it: no padded copy of the sample,
features shared out over ``threads`` threads. The interpreter's lock stays held while
the sample's tensors are read, and each tensor's storage is checked to still hold them
first: a tensor resized or freed after placing raises ``ValueError``, never a read of
freed memory. Every number
(padded lengths, owner blocks, windows, shard-local shifts) comes from the spec crate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.utils.dlpack import from_dlpack

from featshard import Layout, Plan, _native

__all__ = ["Placement", "buffer_views", "place", "rank_blocks"]

# The spec's dtypes, by the names the spec and the executor use.
_DTYPES: dict[torch.dtype, str] = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
_BY_NAME = {name: dtype for dtype, name in _DTYPES.items()}


def _value(x: Any) -> Any:
    """A tensor's DLPack capsule (on the CPU, contiguous), else what the value is."""
    if not isinstance(x, torch.Tensor):
        return type(x).__name__
    if x.dtype not in _DTYPES:
        return str(x.dtype).removeprefix("torch.")
    y = x.detach().cpu().contiguous()
    # The storage goes along: the executor checks it still holds the tensor before
    # every read (a tensor resized or freed since would otherwise be freed memory).
    return (y.__dlpack__(), y.untyped_storage())


class Placement:
    """One sample validated and placed on a CP mesh. Its tensors are read when blocks
    are written: do not write or resize them while the placement is in use."""

    def __init__(self, native: _native.Placement, sample: Mapping[str, Any]) -> None:
        self._native = native
        found = native.features()
        self._features = {n: (_BY_NAME[d], tuple(s)) for n, d, s, _ in found}
        self.global_shapes: dict[str, tuple[int, ...]] = {n: tuple(g) for n, _, _, g in found}
        """Every placed feature's padded global shape (what its DTensor reports)."""
        self.passthrough: dict[str, Any] = {n: sample[n] for n in native.passthrough()}
        """Sample values carried along untouched (metadata, passed-through keys)."""

    @property
    def layout(self) -> Layout:
        """Padded lengths and owner-block positions of the sample on its mesh."""
        result: Layout = self._native.layout()
        return result

    @property
    def features(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        """Every placed feature's dtype and block shape, by name."""
        return dict(self._features)

    def empty_blocks(self, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        """Uninitialised tensors for one rank's blocks (every placed feature by default)."""
        chosen = self._features if names is None else {n: self._features[n] for n in names}
        return {n: torch.empty(s, dtype=d) for n, (d, s) in chosen.items()}

    def write_blocks(
        self, coord: tuple[int, int], outs: Mapping[str, torch.Tensor], threads: int = 1
    ) -> None:
        """Writes the blocks of the rank at CP coordinate ``coord`` into ``outs``
        (contiguous CPU tensors of each block's dtype and shape)."""
        capsules = [(n, t.__dlpack__()) for n, t in outs.items()]
        self._native.write_blocks(coord, capsules, threads)

    def blocks_at(self, coord: tuple[int, int], threads: int = 1) -> dict[str, torch.Tensor]:
        """The blocks of the rank at ``coord``, each in a tensor of its own: on a
        domain-parallel plan, whose ranks' blocks differ in shape, that rank's shapes."""
        out = self._empty(dict(self._native.block_shapes(coord)))
        self.write_blocks(coord, out, threads)
        return out

    def padded(self, threads: int = 1) -> dict[str, torch.Tensor]:
        """Every placed feature's whole padded layout: what all ranks' blocks make
        together, index values in the padded layout, shard-local ids not yet shifted."""
        out = self._empty({n: padded for n, padded, _ in self._native.whole_shapes()})
        self._native.write_padded([(n, t.__dlpack__()) for n, t in out.items()], threads)
        return out

    def serial(self, threads: int = 1) -> dict[str, torch.Tensor]:
        """Every placed feature as intake made it: real items only, derived features
        made, index values as the sample gave them."""
        out = self._empty({n: serial for n, _, serial in self._native.whole_shapes()})
        self._native.write_serial([(n, t.__dlpack__()) for n, t in out.items()], threads)
        return out

    def _empty(self, shapes: Mapping[str, list[int]]) -> dict[str, torch.Tensor]:
        return {n: torch.empty(tuple(s), dtype=self._features[n][0]) for n, s in shapes.items()}

    def rank_blocks(self, coord: tuple[int, int], threads: int = 1) -> dict[str, torch.Tensor]:
        """The blocks of the rank at CP coordinate ``coord``, every placed feature: views
        of one buffer the executor allocated (huge pages advised) and wrote, freed when
        the last of them goes."""
        return self.views(self.rank_buffer(coord, threads))

    def rank_buffer(self, coord: tuple[int, int], threads: int = 1) -> torch.Tensor:
        """The blocks of the rank at ``coord`` in one uint8 tensor (``buffer_offsets``
        tells where each lies): what a source sends that rank."""
        capsule, _ = self._native.rank_buffer(coord, threads)
        return from_dlpack(capsule)

    def buffer_offsets(self) -> tuple[list[tuple[str, int]], int]:
        """Each placed feature's byte offset in a rank's buffer, and the buffer's length."""
        return self._native.buffer_offsets()

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """The blocks in a rank's buffer, by name (views of it)."""
        return buffer_views(buffer, self.wire())

    def wire(self) -> list[tuple[str, str, tuple[int, ...], int]]:
        """What a receiver needs to read a rank's buffer: per feature its name, dtype,
        block shape and byte offset."""
        offsets, _ = self.buffer_offsets()
        return [(n, _DTYPES[self._features[n][0]], self._features[n][1], at) for n, at in offsets]


def buffer_views(
    buffer: torch.Tensor, wire: list[tuple[str, str, tuple[int, ...], int]]
) -> dict[str, torch.Tensor]:
    """The blocks in a rank's buffer (``Placement.wire`` tells where), views of it."""
    out: dict[str, torch.Tensor] = {}
    for name, dtype_name, shape, at in wire:
        dtype = _BY_NAME[dtype_name]
        nbytes = math.prod(shape) * dtype.itemsize
        out[name] = buffer[at : at + nbytes].view(dtype).view(shape)
    return out


def place(
    plan: Plan,
    features: Mapping[str, Any],
    mesh: tuple[int, int],
    *,
    workflow: str | None = None,
    passthrough: Iterable[str] = (),
    threads: int = 1,
) -> Placement:
    """Validates a sample as the featurizer emitted it and places it on ``mesh``.

    Intake runs as the spec declares (dropped keys, incoming pads cut, unowned rows,
    derived features). Raises ``ValueError`` naming the feature and axis at fault, or
    ``TypeError`` for a spec tensor that is not a tensor.
    """
    values = {name: _value(x) for name, x in features.items()}
    native = plan._native.place(values, mesh, workflow, set(passthrough), threads)
    return Placement(native, features)


def rank_blocks(
    plan: Plan,
    features: Mapping[str, Any],
    mesh: tuple[int, int],
    *,
    workflow: str | None = None,
    threads: int = 1,
) -> list[dict[str, torch.Tensor]]:
    """Every rank's blocks of one serial sample; rank ``i * cp1 + j`` holds (i, j)."""
    placed = place(plan, features, mesh, workflow=workflow, threads=threads)
    return [
        placed.rank_blocks(_native.coords(mesh, r), threads) for r in range(mesh[0] * mesh[1])
    ]
