"""One serial sample made into the sample a spec lays out, and padded to a mesh's global
layout, by featshard's byte executor.

What the generated ``<module>.py`` offers as ``intake``, ``layouts`` and
``pad_features``, on any plan. Every number (padded lengths, owner-block positions,
index values moved into the padded layout) comes from the spec crate; tensors are
written straight from the sample's memory into tensors allocated for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from featshard import Plan
from featshard.blocks import place

__all__ = ["SemanticLayout", "intake", "layouts", "pad_features", "pad_multiple", "padded_lengths"]


class SemanticLayout(NamedTuple):
    """The padded layout of one semantic for one sample."""

    padded: int
    """The padded length."""
    positions: torch.Tensor | None
    """Where every item sits in the padded axis (owner-partitioned semantics only)."""
    per_block: int | None
    """Padded items per owner block (owner-partitioned semantics only)."""
    length: int
    """The serial length."""


def intake(
    plan: Plan, features: Mapping[str, Any], *, workflow: str | None = None
) -> dict[str, Any]:
    """A sample as the featurizer emitted it, made into the sample ``plan`` lays out:
    dropped keys gone, other keys refused, dropped or passed by the spec's
    ``other_keys``, incoming pads cut, unowned owner-map rows dropped where the spec says
    they are pads, derived features made (or checked when given). The sample is
    validated as well. Idempotent: a taken sample comes back unchanged."""
    placed = place(plan, features, (1,) * len(plan.mesh_axes), workflow=workflow)
    return dict(sorted({**placed.serial(), **placed.passthrough}.items()))


def layouts(
    plan: Plan,
    features: Mapping[str, Any],
    mesh: tuple[int, ...],
    *,
    workflow: str | None = None,
) -> dict[str, SemanticLayout]:
    """The padded layout on ``mesh`` of every semantic present in a serial sample."""
    lay = place(plan, features, mesh, workflow=workflow).layout
    positions, per_block, sizes = lay.positions, lay.per_block, lay.sizes
    return {
        sem: SemanticLayout(
            padded,
            torch.tensor(positions[sem]) if sem in positions else None,
            per_block.get(sem),
            sizes[sem],
        )
        for sem, padded in lay.padded.items()
    }


def pad_features(
    plan: Plan,
    features: Mapping[str, Any],
    mesh: tuple[int, ...],
    *,
    workflow: str | None = None,
    threads: int = 1,
) -> dict[str, Any]:
    """One serial sample padded to the global padded layout of ``mesh``.

    Every semantic axis grows to its padded length (owner-partitioned axes laid out in
    equal owner blocks), pads hold the feature's pad value (0 in masks), and index
    values pointing into an owner-partitioned layout move with their items. Metadata
    and passed-through keys come back as they are. Sharding (diagonal blocks,
    shard-local ids) is the next step: :func:`featshard.blocks.rank_blocks`.
    """
    placed = place(plan, features, mesh, workflow=workflow, threads=threads)
    return dict(sorted({**placed.padded(threads), **placed.passthrough}.items()))


def pad_multiple(plan: Plan, semantic: str, mesh: tuple[int, ...]) -> int:
    """The multiple ``semantic``'s axes pad to on ``mesh`` (1 when never padded)."""
    return plan.pad_multiple(semantic, mesh)


def padded_lengths(
    plan: Plan,
    mesh: tuple[int, ...],
    lengths: Mapping[str, int],
    owner_counts: Mapping[str, Any] | None = None,
) -> dict[str, int]:
    """The padded length on ``mesh`` of every semantic in ``lengths``; each
    owner-partitioned one needs its items per direct owner in ``owner_counts`` (a
    sequence or a tensor, e.g. atoms per token)."""
    counts = {s: [int(c) for c in v] for s, v in (owner_counts or {}).items()}
    return plan.layout(mesh, dict(lengths), counts).padded
