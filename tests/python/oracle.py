"""An independent Python reference for every rank's blocks: the generated module's
`pad_features`, then each rank's window cut with torch and shard-local ids shifted,
from the module's tables alone. The parity tests hold featshard's byte executor (the
package's `featshard.blocks`, `featshard shard`) and the Rust runtime to it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import torch


def _real_mask(P: ModuleType, name: str, lay: Mapping[str, Any], shape: Sequence[int]) -> torch.Tensor:
    """True at the real items of every semantic axis of `name` in the padded layout."""
    mask = torch.ones((), dtype=torch.bool)
    for d, sem in enumerate(P.FEATURE_AXIS_SEMANTICS[name]):
        if sem is None:
            continue
        layout = lay[sem]
        if layout.positions is not None:
            axis = torch.zeros(layout.padded, dtype=torch.bool)
            axis[layout.positions] = True
        else:
            axis = torch.arange(layout.padded) < layout.length
        view = [1] * len(shape)
        view[d] = -1
        mask = mask & axis.view(view)
    return mask


def local_block(P: ModuleType, name: str, padded: torch.Tensor, lay: Mapping[str, Any],
                mesh: tuple[int, int], coord: tuple[int, int]) -> torch.Tensor:
    """One rank's block of a padded feature: each split axis narrowed to the block of its
    mesh axis' coordinate, shard-local ids shifted by the shard's start."""
    x = padded
    mask = _real_mask(P, name, lay, padded.shape) if name in P.SHARD_LOCAL else None
    for d, split in enumerate(P.SPLITS[name]):
        if split is None:
            continue
        n = padded.shape[d] // mesh[split[1]]
        x = x.narrow(d, coord[split[1]] * n, n)
        if mask is not None and mask.shape[d] != 1:
            mask = mask.narrow(d, coord[split[1]] * n, n)
    if mask is not None:
        of, mesh_axis = P.SHARD_LOCAL[name]
        start = coord[mesh_axis] * (lay[of].padded // mesh[mesh_axis])
        x = x - mask.to(x.dtype) * start
    return x.contiguous()


def rank_blocks(P: ModuleType, features: Mapping[str, Any], mesh: tuple[int, int]) -> list[dict[str, torch.Tensor]]:
    """Every rank's blocks of one serial sample; rank `i * cp1 + j` holds coordinate (i, j)."""
    features = P.intake(features)
    lay = P.layouts(features, mesh)
    padded = P.pad_features(features, mesh)
    names = sorted(n for n in padded if n in P.PLACEMENTS)
    return [
        {n: local_block(P, n, padded[n], lay, mesh, (r // mesh[1], r % mesh[1])) for n in names}
        for r in range(mesh[0] * mesh[1])
    ]
