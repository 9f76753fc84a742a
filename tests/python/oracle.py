"""An independent Python reference for every rank's blocks, from a generated module's
tables alone: intake, the padded layout and the padding written out in torch (the
rules as the spec documents them, not featshard's code), then each rank's window cut
and shard-local ids shifted. The parity tests hold featshard's byte executor (the
package, the generated modules' functions, `featshard shard`) and the Rust runtime to
it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any, NamedTuple

import torch


class Layout(NamedTuple):
    """The padded layout of one semantic for one sample."""

    padded: int
    # Position of every item in the padded axis (owner-partitioned semantics only).
    positions: torch.Tensor | None
    # Padded items per owner block (owner-partitioned semantics only).
    per_block: int | None
    # The serial length.
    length: int


def _lcm(sizes: Iterable[int]) -> int:
    out = 1
    for s in sizes:
        out = out * s // math.gcd(out, s)
    return out


def _check_mesh(mesh: tuple[int, int]) -> None:
    if len(mesh) != 2 or any(int(m) < 1 for m in mesh):
        raise ValueError(f"mesh {mesh!r}: expected (cp0, cp1) sizes, each at least 1")


def pad_multiple(P: ModuleType, semantic: str, mesh: tuple[int, int]) -> int:
    """The multiple a semantic pads to on `mesh` (its owner-block count if owned)."""
    _check_mesh(mesh)
    info = P.SEMANTICS[semantic]
    if info.padding == "none":
        return 1
    return _lcm(mesh[m] for m in info.mesh_axes)


def _owner_blocks(
    P: ModuleType,
    semantic: str,
    root_of_item: torch.Tensor,
    root_padded: int,
    mesh: tuple[int, int],
) -> Layout:
    blocks = pad_multiple(P, semantic, mesh)
    owners_per_block = max(root_padded // blocks, 1)
    block = torch.clamp(root_of_item // owners_per_block, max=blocks - 1)
    block_counts = torch.bincount(block, minlength=blocks)
    per_block = int(block_counts.max()) if block.numel() else 0
    # Rank of each item within its block, keeping serial order (stable sort).
    order = torch.argsort(block, stable=True)
    starts = torch.cumsum(block_counts, 0) - block_counts
    rank = torch.empty_like(block)
    rank[order] = (
        torch.arange(block.numel(), device=block.device) - starts[block[order]]
    )
    return Layout(
        blocks * per_block, block * per_block + rank, per_block, int(block.numel())
    )


def _is_spec_tensor(P: ModuleType, name: str) -> bool:
    return name in P.PLACEMENTS


def _keys(P: ModuleType, features: Mapping[str, Any]) -> dict[str, Any]:
    """The sample without dropped keys; other keys refused (all named), dropped or passed."""
    out: dict[str, Any] = {}
    unknown = []
    for name in sorted(features):
        if _is_spec_tensor(P, name) or name in P.METADATA_FEATURES:
            out[name] = features[name]
        elif name in P.DROP or P.OTHER_KEYS == "drop":
            continue
        elif P.OTHER_KEYS == "pass":
            out[name] = features[name]
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(
            f"features not in the spec: {', '.join(f'`{n}`' for n in unknown)} "
            "(declare them, list them under `drop`, or set `other_keys: drop | pass`)"
        )
    for name, x in out.items():
        if _is_spec_tensor(P, name) and not isinstance(x, torch.Tensor):
            raise TypeError(
                f"feature `{name}`: expected a torch.Tensor, got {type(x).__name__}"
            )
    return out


def _mask_prefix(name: str, sem: str, x: torch.Tensor) -> int:
    """How many leading ones a 1-D incoming-pad mask holds (values 0 or 1, ones first)."""
    where = f"feature `{name}`, axis 0 ({sem}, incoming pads)"
    if x.dim() != 1:
        raise ValueError(f"{where}: expected a 1-D mask, got shape {tuple(x.shape)}")
    values = x.to(torch.float64).cpu()
    bad = (values != 0) & (values != 1)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"{where}: mask values are 0 or 1, found {float(values[i])} at {i}"
        )
    ones = values == 1
    n = int(ones.long().cumprod(0).sum())
    if bool(ones[n:].any()):
        raise ValueError(
            f"{where}: the real items must come first: item {n + int(ones[n:].nonzero()[0])} "
            f"is real after a pad at {n}"
        )
    return n


def _cut(P: ModuleType, out: dict[str, Any], sem: str, n: int) -> None:
    """Cuts every `sem` axis to its `n` real items; one-hot maps may not point into the cut."""
    for name in sorted(out):
        if not _is_spec_tensor(P, name):
            continue
        x = out[name]
        for d, s in enumerate(P.FEATURE_AXIS_SEMANTICS[name]):
            if s != sem or d >= x.dim() or int(x.shape[d]) == n:
                continue
            where = f"feature `{name}`, axis {d} ({sem}, incoming pads)"
            if int(x.shape[d]) < n:
                raise ValueError(
                    f"{where}: length {int(x.shape[d])}, fewer than the {n} real {sem}"
                )
            role = P.INDEX_FEATURES.get(name)
            if (
                role is not None
                and role.one_hot == d
                and bool(x.narrow(d, n, int(x.shape[d]) - n).ne(0).any())
            ):
                raise ValueError(
                    f"{where}: a row points at an incoming pad (an item at {n} or later)"
                )
            x = x.narrow(d, 0, n)
        out[name] = x


def _counts_agree(
    P: ModuleType, out: Mapping[str, Any], sem: str, mask: str, n: int
) -> None:
    info = P.SEMANTICS[sem]
    counts = out.get(info.owner_counts) if info.owner_counts is not None else None
    if counts is not None and int(counts.sum()) != n:
        raise ValueError(
            f"feature `{info.owner_counts}`, axis 0 ({info.owner}): counts of `{sem}` sum to "
            f"{int(counts.sum())}, but `{mask}` marks {n} real {sem}"
        )


def _drop_unowned_rows(
    P: ModuleType, out: dict[str, Any], sem: str, owner_map: str
) -> None:
    rows = out[owner_map].sum(dim=1)
    if bool((rows != 0).all()):
        return
    owned = (rows != 0).nonzero().flatten()
    for name in sorted(out):
        if not _is_spec_tensor(P, name):
            continue
        for d, s in enumerate(P.FEATURE_AXIS_SEMANTICS[name]):
            if s == sem:
                out[name] = out[name].index_select(d, owned.to(out[name].device))


def _outer(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    x = a.reshape(tuple(a.shape) + (1,) * b.dim()).to(dtype)
    y = b.reshape((1,) * a.dim() + tuple(b.shape)).to(dtype)
    return x * y


def intake(P: ModuleType, features: Mapping[str, Any]) -> dict[str, Any]:
    """A sample as the featurizer emitted it, made into the sample the spec lays out.

    Dropped keys go, other keys are refused, dropped or passed by `P.OTHER_KEYS`; every
    axis of a semantic that arrives padded is cut to its real items; owner-map rows
    without an owner are dropped where the spec says they are pads; derived features are
    made (or checked when given). Idempotent: a taken sample comes back unchanged.
    """
    out = _keys(P, features)
    for sem in P.SEMANTIC_ORDER:
        info = P.SEMANTICS[sem]
        if info.incoming is None or info.incoming[1] not in out:
            continue
        kind, name = info.incoming
        x = out[name]
        if kind == "mask":
            n = _mask_prefix(name, sem, x)
            _counts_agree(P, out, sem, name, n)
        else:
            n = int(x.sum())
        _cut(P, out, sem, n)
    for sem in P.SEMANTIC_ORDER:
        info = P.SEMANTICS[sem]
        if (
            info.unowned_rows_are_pads
            and info.owner_map is not None
            and info.owner_map in out
        ):
            _drop_unowned_rows(P, out, sem, info.owner_map)
    for name, (a, b) in sorted(P.DERIVED.items()):
        if a not in out or b not in out:
            continue
        made = _outer(out[a], out[b], P.DTYPES[name])
        given = out.get(name)
        if given is None:
            out[name] = made
        elif (
            given.shape != made.shape
            or given.dtype != made.dtype
            or not torch.equal(given, made)
        ):
            raise ValueError(
                f"feature `{name}`: the sample's value differs from the outer product of "
                f"`{a}` and `{b}`, which the spec derives it as"
            )
    return dict(sorted(out.items()))


def _sample_lengths(P: ModuleType, features: Mapping[str, Any]) -> dict[str, int]:
    lengths: dict[str, int] = {}
    seen_in: dict[str, str] = {}
    for name in sorted(features):
        if not _is_spec_tensor(P, name):
            continue
        x = features[name]
        axes = P.FEATURE_AXIS_SEMANTICS[name]
        if x.dim() != len(axes):
            raise ValueError(
                f"feature `{name}`: expected {len(axes)} axes {axes}, got shape {tuple(x.shape)}"
            )
        if x.dtype != P.DTYPES[name]:
            raise ValueError(
                f"feature `{name}`: expected dtype {P.DTYPES[name]}, got {x.dtype}"
            )
        for d, (sem, size) in enumerate(zip(axes, P.CHANNEL_SIZES[name])):
            n = int(x.shape[d])
            if sem is None:
                if n != size:
                    raise ValueError(
                        f"feature `{name}`, axis {d} (channel): expected size {size}, got {n}"
                    )
            elif sem in lengths and lengths[sem] != n:
                raise ValueError(
                    f"feature `{name}`, axis {d} ({sem}): length {n}, but feature "
                    f"`{seen_in[sem]}` has {sem} length {lengths[sem]}"
                )
            else:
                lengths[sem] = n
                seen_in.setdefault(sem, name)
    return lengths


def layouts(
    P: ModuleType, features: Mapping[str, Any], mesh: tuple[int, int]
) -> dict[str, Layout]:
    """The padded layout of every semantic present in one serial sample (after `intake`)."""
    _check_mesh(mesh)
    features = intake(P, features)
    lengths = _sample_lengths(P, features)
    out: dict[str, Layout] = {}
    root_of: dict[str, torch.Tensor] = {}
    for sem in P.SEMANTIC_ORDER:
        if sem not in lengths:
            continue
        info = P.SEMANTICS[sem]
        n = lengths[sem]
        if info.padding != "owner_blocks":
            m = pad_multiple(P, sem, mesh)
            out[sem] = Layout(-(-n // m) * m, None, None, n)
            root_of[sem] = torch.arange(n)
            continue
        assert info.owner is not None and info.root is not None
        if info.owner not in root_of:
            raise ValueError(
                f"semantic `{sem}`: no feature gives the length of its owner `{info.owner}`"
            )
        counts_f, map_f = info.owner_counts, info.owner_map
        if counts_f is not None and counts_f in features:
            counts = features[counts_f].to(torch.int64).cpu()
            if bool((counts < 0).any()) or int(counts.sum()) != n:
                raise ValueError(
                    f"feature `{counts_f}`, axis 0 ({info.owner}): counts must be >= 0 "
                    f"and sum to the {sem} length {n}, got sum {int(counts.sum())}"
                )
            owner_of = torch.arange(counts.numel()).repeat_interleave(counts)
            if map_f is not None and map_f in features:
                by_map = _map_owners(features[map_f], map_f, sem, info.owner)
                if not torch.equal(by_map, owner_of):
                    item = int((by_map != owner_of).nonzero()[0])
                    raise ValueError(
                        f"feature `{map_f}`, axis 1 ({info.owner}): `{sem}` item {item} belongs to "
                        f"`{info.owner}` {int(by_map[item])} here, but to {int(owner_of[item])} by `{counts_f}`"
                    )
        elif map_f is not None and map_f in features:
            owner_of = _map_owners(features[map_f], map_f, sem, info.owner)
        else:
            raise ValueError(
                f"semantic `{sem}`: owner feature `{map_f or counts_f}` is missing from the sample"
            )
        root = root_of[info.owner][owner_of]
        root_of[sem] = root
        out[sem] = _owner_blocks(P, sem, root, out[info.root].padded, mesh)
    return out


def _check_mask(name: str, x: torch.Tensor) -> None:
    """A mask's values are 0 or 1: false/true, integers 0 and 1, floats 0.0 and 1.0."""
    if x.dtype == torch.bool or x.numel() == 0:
        return
    bad = (x != 0) & (x != 1)
    if bool(bad.any()):
        at = int(bad.flatten().nonzero()[0])
        raise ValueError(
            f"feature `{name}`: a mask holds 0 or 1 (false/true, 0/1, 0.0/1.0), "
            f"found {float(x.flatten()[at])} at flat index {at}"
        )


def _map_owners(m: torch.Tensor, name: str, sem: str, owner: str) -> torch.Tensor:
    """The owner of every row of a one-hot `[items, owner]` map."""
    rows = m.sum(dim=1)
    if not bool((rows == 1).all()):
        r = int((rows != 1).nonzero()[0])
        raise ValueError(
            f"feature `{name}`, axis 1 ({owner}): row {r} of `{sem}` must have exactly one owner, "
            f"has {int(rows[r])}"
        )
    if m.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64)
    return m.argmax(dim=1).cpu()


def pad_features(
    P: ModuleType, features: Mapping[str, Any], mesh: tuple[int, int]
) -> dict[str, Any]:
    """Pads one serial sample to the global padded layout of `mesh`.

    Every semantic axis grows to its padded length (owner-partitioned axes are laid out
    in equal owner blocks), pad positions hold the feature's pad value (0 in masks),
    and `padded_global` index values become positions in the padded layout. Metadata
    passes through, as do keys passed by `P.OTHER_KEYS`. The sample goes through `intake`
    first. Sharding (diagonal blocks, shard-local ids) is the next step.
    """
    features = intake(P, features)
    lay = layouts(P, features, mesh)
    out: dict[str, Any] = {}
    for name in sorted(features):
        x = features[name]
        if not _is_spec_tensor(P, name):
            out[name] = x
            continue
        if name in P.MASKS:
            _check_mask(name, x)
        role = P.INDEX_FEATURES.get(name)
        if role is not None and role.scope == "padded_global" and role.one_hot is None:
            target = lay.get(role.of)
            if target is None:
                raise ValueError(
                    f"feature `{name}`: indexes `{role.of}`, but no `{role.of}` axis was given"
                )
            n = int(target.positions.numel()) if target.positions is not None else None
            if n is not None and x.numel() and (int(x.min()) < 0 or int(x.max()) >= n):
                raise ValueError(
                    f"feature `{name}`: index values must lie in [0, {n}) of `{role.of}`"
                )
            if target.positions is not None:
                x = target.positions.to(x.device)[x]
        for d, sem in enumerate(P.FEATURE_AXIS_SEMANTICS[name]):
            if sem is None:
                continue
            layout = lay[sem]
            if layout.positions is None and layout.padded == x.shape[d]:
                continue
            shape = list(x.shape)
            shape[d] = layout.padded
            y = torch.full(shape, P.PAD_VALUES[name], dtype=x.dtype, device=x.device)
            if layout.positions is not None:
                idx = layout.positions.to(x.device)
            else:
                idx = torch.arange(x.shape[d], device=x.device)
            y.index_copy_(d, idx, x)
            x = y
        out[name] = x
    return out


def _real_mask(
    P: ModuleType, name: str, lay: Mapping[str, Any], shape: Sequence[int]
) -> torch.Tensor:
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


def local_block(
    P: ModuleType,
    name: str,
    padded: torch.Tensor,
    lay: Mapping[str, Any],
    mesh: tuple[int, int],
    coord: tuple[int, int],
) -> torch.Tensor:
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


def rank_blocks(
    P: ModuleType, features: Mapping[str, Any], mesh: tuple[int, int]
) -> list[dict[str, torch.Tensor]]:
    """Every rank's blocks of one serial sample; rank `i * cp1 + j` holds coordinate (i, j)."""
    features = intake(P, features)
    lay = layouts(P, features, mesh)
    padded = pad_features(P, features, mesh)
    names = sorted(n for n in padded if n in P.PLACEMENTS)
    return [
        {
            n: local_block(P, n, padded[n], lay, mesh, (r // mesh[1], r % mesh[1]))
            for n in names
        }
        for r in range(mesh[0] * mesh[1])
    ]
