"""featshard: one YAML spec for every context-parallel feature placement and padding plan.

The package wraps featshard's Rust core (``featshard._native``, one abi3 module for every
CPython >= 3.10, no libtorch): the ``featshard`` command runs in process, :func:`plan`
gives a spec's Plan IR, and :class:`Plan` the geometry of any sample on any mesh
(padded lengths, owner-block positions, shapes, block windows), computed by the same
Rust functions the executors use.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

from featshard import _native
from featshard._native import (
    Feature,
    Layout,
    Semantic,
    Shapes,
    __version__,
    chunk_sizes,
    coords,
    plan_json,
    replica_indices,
)

__all__ = [
    "Feature",
    "Layout",
    "Plan",
    "Semantic",
    "Shapes",
    "__version__",
    "chunk_sizes",
    "coords",
    "plan",
    "plan_json",
    "replica_indices",
]


def plan(spec: str | os.PathLike[str]) -> dict[str, Any]:
    """The Plan IR of the spec file ``spec`` (what ``<module>.plan.json`` holds).

    Raises ``ValueError`` with the spec error, its file, line and column.
    """
    result: dict[str, Any] = _native.plan_ir(os.fspath(spec))
    return result


class Plan:
    """A compiled spec and its geometry."""

    def __init__(self, spec: str | os.PathLike[str]) -> None:
        self._native = _native.Plan.from_file(os.fspath(spec))

    @classmethod
    def from_plan_file(
        cls, path: str | os.PathLike[str], *, sha256: str | None = None
    ) -> Plan:
        """The plan ``featshard generate`` wrote to ``<module>.plan.json``. With
        ``sha256``, refuses a plan made from another spec (a generated module passes its
        ``SPEC_SHA256``, so a stale plan file next to it is an error, not a silent
        mismatch)."""
        try:
            text = open(path, encoding="utf-8").read()  # noqa: SIM115 - read whole, closed by GC
        except OSError as e:
            raise FileNotFoundError(
                f"{os.fspath(path)}: the plan file `featshard generate` writes next to the"
                f" generated modules cannot be read ({e.strerror})"
            ) from e
        plan = cls.__new__(cls)
        try:
            plan._native = _native.Plan.from_json(text)
        except ValueError as e:
            raise ValueError(f"{os.fspath(path)}: not a featshard plan: {e}") from e
        if sha256 is not None and plan.sha256 != sha256:
            raise ValueError(
                f"{os.fspath(path)}: made from another spec (sha256 {plan.sha256}, the module"
                f" expects {sha256}): run `featshard generate` again"
            )
        return plan

    def __getstate__(self) -> str:
        # A worker process started by spawn or a fork server gets the plan as its JSON.
        return str(self._native.json())

    def __setstate__(self, state: str) -> None:
        self._native = _native.Plan.from_json(state)

    @property
    def sha256(self) -> str:
        """The sha256 of the spec the plan was made from."""
        return self._native.sha256

    @functools.cached_property
    def ir(self) -> dict[str, Any]:
        """The Plan IR as plain data (what ``<module>.plan.json`` holds), for printing and
        serializing; the typed tables below are what code reads."""
        result: dict[str, Any] = self._native.ir()
        return result

    @functools.cached_property
    def features(self) -> dict[str, Feature]:
        """Every tensor feature's table (placements, axes, dtype, pad value, role)."""
        return self._native.features

    @functools.cached_property
    def tensor_names(self) -> list[str]:
        """The tensor features' names, sorted."""
        return sorted(self.features)

    @functools.cached_property
    def metadata(self) -> list[str]:
        """The features passed through untouched, sorted."""
        return self._native.metadata

    @functools.cached_property
    def semantics(self) -> dict[str, Semantic]:
        """Every axis semantic's table."""
        return self._native.semantics

    @property
    def mesh_axes(self) -> list[str]:
        """The mesh axes that split a sample: ``(cp0, cp1)``, or a domain mesh's axes."""
        return self._native.mesh_axes

    def mesh_dims(self, names: Sequence[str] | None, ndim: int) -> tuple[int | None, list[int]]:
        """Where a device mesh of ``ndim`` dimensions named ``names`` has the DP axis (if
        any) and the sample's axes, found by the spec's names for them; a mesh whose
        names are not the spec's is refused by name (``ValueError``)."""
        return self._native.mesh_dims(list(names) if names is not None else None, ndim)

    @property
    def dp_axis(self) -> str | None:
        """The data-parallel axis's name, if the spec names one."""
        return self._native.dp_axis

    @property
    def uneven(self) -> list[bool] | None:
        """A domain plan's per-axis flags (shards may be uneven); ``None`` for CP."""
        return self._native.uneven

    @property
    def module(self) -> str:
        """The generated module's name."""
        return self._native.module

    def layout(
        self,
        mesh: Sequence[int],
        sizes: dict[str, int],
        counts: dict[str, list[int]] | None = None,
        owners: dict[str, list[int]] | None = None,
    ) -> Layout:
        """One sample's layout on ``mesh``: every semantic's length in ``sizes``; for each
        owner-partitioned one, its items per direct owner (``counts``) or the direct owner
        of every item (``owners``). ``ValueError`` when they do not fit the plan."""
        return self._native.layout(list(mesh), sizes, counts or {}, owners or {})

    def shapes(self, layout: Layout, names: list[str]) -> dict[str, Shapes]:
        """The shapes of the named features under ``layout``."""
        return self._native.shapes(layout, names)

    # The native plan's entry points the package's modules use; this class is the one
    # place that reaches `_native.Plan`.

    def place(self, values: dict[str, Any], mesh: tuple[int, ...], workflow: str | None,
              passthrough: set[str], threads: int, objects: dict[str, bytes | str]) -> _native.Placement:
        """The executor's placement of ``values`` (see :func:`featshard.blocks.place`);
        ``objects``: the values it cannot read, pickled (or why they do not pickle)."""
        return self._native.place(values, mesh, workflow, passthrough, threads, objects)

    def expand_blocks(self, blocks: list[tuple[str, list[int], Any]]) -> tuple[Any, list[int]]:
        """Compact blocks checked and expanded by the executor into one new buffer."""
        return self._native.expand_blocks(blocks)

    def shard_folder(self, folder: str | os.PathLike[str], mesh: tuple[int, ...] | None = None) -> _native.ShardFolder:
        """A pre-sharded sample's folder, its manifest read and checked against the plan
        and, with ``mesh``, that CP mesh; ``ValueError`` naming the file otherwise."""
        return self._native.shard_folder(os.fspath(folder), mesh)

    def read_dataset(self, root: str | os.PathLike[str], mesh: tuple[int, ...]) -> list[str]:
        """The samples of a pre-sharded dataset folder that did not fail (its
        ``dataset.json`` checked against the plan and ``mesh``)."""
        return self._native.read_dataset(os.fspath(root), mesh)

    def check_shapes(self, shapes: dict[str, tuple[str, list[int]]]) -> dict[str, int]:
        """The checks of ``place`` that need no values, on dtypes and shapes."""
        return self._native.check_shapes(shapes)

    def device_mesh(self, sizes: Sequence[int], dp: int = 1) -> tuple[list[str], list[int], int]:
        """The device mesh of ``dp`` replicas of a mesh of ``sizes``: its dimension names
        (the DP axis first where the spec names one), their sizes and its world size."""
        return self._native.device_mesh(list(sizes), dp)

    def input_shapes(self, lengths: dict[str, int]) -> dict[str, tuple[str, list[int]]]:
        """Every sample input's dtype name and shape at these semantics' lengths (a
        sample known by its lengths alone), as :meth:`check_shapes` takes them."""
        return self._native.input_shapes(lengths)

    def real_shape(
        self, name: str, shape: Sequence[int], lengths: dict[str, int], semantics: Sequence[str | None] | None = None
    ) -> list[int] | None:
        """Output (or feature) ``name``'s real shape given padded as ``shape``: axes of a
        semantic in ``lengths`` cut back to it, by ``semantics`` (one per axis) or the
        spec's declaration; None for a value neither names."""
        return self._native.real_shape(name, list(shape), lengths, None if semantics is None else list(semantics))

    def real_window(self, name: str, window: Sequence[tuple[int, int]], lengths: dict[str, int]) -> list[tuple[int, int]]:
        """The part of ``window`` (``(start, len)`` per axis of feature ``name``'s padded
        layout) that holds real items given every semantic's real length: ``(start,
        stop)`` per axis."""
        return self._native.real_window(name, list(window), lengths)

    def collate_frame(
        self,
        samples: list[dict[str, list[int]]] | None,
        others: list[dict[str, tuple[str, list[int]] | None]] | None = None,
    ) -> _native.CollateFrame:
        """Collate's frame for a batch (each sample as its blocks' local shapes, and its
        other values: a tensor's dtype and shape, or None): what a DP replica all-reduces
        by max; ``ValueError`` naming what collate refuses in the batch. ``samples``
        None: the frame of a replica that failed."""
        return self._native.collate_frame(samples, others)

    def collate_targets(self, frame: _native.CollateFrame, reduced: list[int]) -> dict[str, list[int]] | None:
        """Every held feature's target local shape from ``frame`` reduced by max over the
        DP group; None when a replica failed (exchange status frames to learn why);
        ``ValueError`` where the replicas' batches differ in size or features."""
        return self._native.collate_targets(frame, reduced)

    def check_parameter(self, name: str, dtype: str, shape: Sequence[int], mesh: Sequence[int]) -> None:
        """The checks of domain model parameter ``name`` (a spec dtype name, a shape)
        before it is sharded over the domain mesh ``mesh``: rank, dtype, channel sizes,
        each split axis at least as long as its ranks; ``ValueError`` otherwise."""
        self._native.check_parameter(name, dtype, list(shape), list(mesh))

    def pad_multiple(self, semantic: str, mesh: tuple[int, ...]) -> int:
        """The multiple ``semantic``'s axes pad to on ``mesh``."""
        return self._native.pad_multiple(semantic, mesh)

    def collate_join(
        self, name: str, local: dict[str, list[int]], targets: dict[str, list[int]]
    ) -> tuple[list[int], bool | int | float, tuple[int, int] | None, list[tuple[int, int, int]]]:
        """How feature ``name``'s block joins a collated batch: its target shape, pad value,
        the re-pad ``(old, new)`` of an index into a sharded semantic's blocks (None:
        values stay), and the ``(axis, old, new)`` of each whole axis re-laid out block
        by block."""
        return self._native.collate_join(name, local, targets)

    def collated_shape(self, name: str, local: list[int], batch: int, dp: int, cp: tuple[int, ...]) -> list[int]:
        """The DTensor global shape of a DP batch of feature ``name``."""
        return self._native.collated_shape(name, local, batch, dp, cp)

    def block_window(
        self, feature: str, local: list[int], coord: tuple[int, ...], mesh: tuple[int, ...]
    ) -> list[tuple[int, int]]:
        """The ``(start, len)`` per axis of the feature's padded layout that the rank at CP
        coordinate ``coord`` of ``mesh`` holds; ``ValueError`` for a coordinate off the
        mesh."""
        return self._native.block_window(feature, local, coord, mesh)

    def padded_length(self, semantic: str, length: int, mesh: Sequence[int]) -> int:
        """The length ``semantic``'s axes pad to for ``length`` items on ``mesh`` (a CP
        mesh, or a domain mesh of one or two axes); ``length`` where never padded."""
        return self._native.padded_length(semantic, length, list(mesh))

    def domain_window(
        self, feature: str, global_shape: Sequence[int], mesh: Sequence[int], coord: Sequence[int]
    ) -> list[tuple[int, int]]:
        """The ``(start, len)`` per axis of ``feature``'s global shape that the rank at
        ``coord`` of domain mesh ``mesh`` holds: its ``torch.chunk`` piece on an uneven
        axis, its equal block on an even one."""
        return self._native.domain_window(feature, list(global_shape), list(mesh), list(coord))

    def sharding_shapes(
        self, feature: str, global_shape: Sequence[int], mesh: Sequence[int], coord: Sequence[int]
    ) -> dict[int, list[list[int]]]:
        """ShardTensor's ``sharding_shapes`` of ``feature`` as the rank at ``coord`` sees it:
        per mesh axis that splits it, the local shapes of the ranks along that axis."""
        return self._native.sharding_shapes(feature, list(global_shape), list(mesh), list(coord))
