"""DP collate keeps every index naming its item: on dp x cp meshes whose replicas hold
samples of different lengths, each rank's blocks grow at their ends, and every atom's
delivered token id, every frame's atom id and every column of a one-hot map must name
after collate the item it named before. Checked by meaning on the collated DTensors'
whole tensors (which item each position holds, read off the serial numbers the samples
carry), with owner blocks on a tile, in serial order on one CP axis, and with
`layout: windows` on both."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import start_ranks

HERE = Path(__file__).resolve().parent

# Serial numbers start past the pads (0 and -1), so that a pad never reads as an item.
TOKEN0, ATOM0 = 100, 1000


def spec_text(one_axis: bool, windows: bool) -> str:
    cp = "[cp]" if one_axis else "[c0, c1]"
    layout = ", layout: windows, window: 4" if windows else ""
    # A one-hot map beside the id vector where the mesh keeps its columns global.
    onehot = (
        "  atom_to_token: {axes: [atoms, tokens], dtype: int64, coshard: [{axis: 1, follows: 0}],"
        " index: {of: tokens, scope: shard_local, one_hot: 1}}\n"
        if one_axis and not windows else ""
    )
    return (
        f"version: 1\nmodule: ids\nmesh: {{cp: {cp}, dp: dp}}\n"
        "semantics:\n  tokens: {shard: true}\n"
        f"  atoms: {{shard: true, owner: tokens, map: atom_to_token_idx{layout}}}\n"
        "features:\n"
        "  token_serial: {axes: [tokens], dtype: int64}\n"
        "  atom_serial: {axes: [atoms], dtype: int64}\n"
        "  atom_to_token_idx: {axes: [atoms], dtype: int64, pad: -1,"
        " index: {of: tokens, scope: shard_local}}\n"
        "  frame_atom_index: {axes: [tokens, 3], dtype: int64, pad: -1,"
        " index: {of: atoms, scope: padded_global, none: -1}}\n"
        + onehot
    )


def sample(tokens: int, seed: int, onehot: bool) -> dict[str, Any]:
    """A sample of `tokens` tokens owning 1-3 atoms each; a token of one atom has no
    frame (-1), as an ion in the AlphaFold3 family."""
    import torch

    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 4, (tokens,), generator=g)
    owner = torch.repeat_interleave(torch.arange(tokens), counts)
    starts = torch.cumsum(counts, 0) - counts
    frames = torch.stack([starts, starts + (counts > 1).long(), starts + counts - 1], 1)
    frames[counts == 1] = -1
    out = {
        "token_serial": torch.arange(tokens) + TOKEN0,
        "atom_serial": torch.arange(owner.numel()) + ATOM0,
        "atom_to_token_idx": owner,
        "frame_atom_index": frames,
    }
    if onehot:
        out["atom_to_token"] = torch.nn.functional.one_hot(owner, tokens)
    return out


def global_ids(plan: Any, name: str, ids: Any, items_block: int, rows_block: int) -> Any:
    """A whole tensor's ids as positions of the whole axis: shard-local ids shifted by
    the start of the shard their row lies in (its row block's number times the block of
    the items they point into); -1 stays."""
    import torch

    if plan.ir["features"][name]["remap"]["kind"] != "shard_local":
        return ids
    shard = torch.arange(ids.shape[0]) // rows_block
    shift = shard.view(-1, *[1] * (ids.dim() - 1)) * items_block
    return torch.where(ids >= 0, ids + shift, ids)


def check_replica(plan: Any, got: dict[str, Any], row: int, want: dict[str, Any], cp0: int) -> int:
    """Every item the collated row holds is named by every index that names it."""
    token = got["token_serial"].full_tensor()[row]
    atom = got["atom_serial"].full_tensor()[row]
    t_block, a_block = token.shape[0] // cp0, atom.shape[0] // cp0
    owner = global_ids(plan, "atom_to_token_idx", got["atom_to_token_idx"].full_tensor()[row],
                       t_block, a_block)
    frames = got["frame_atom_index"].full_tensor()[row]
    checked = 0
    for p in range(atom.shape[0]):
        if int(atom[p]) < ATOM0:
            assert int(owner[p]) == -1, f"the pad atom at {p} names token position {int(owner[p])}"
            continue
        a = int(atom[p]) - ATOM0
        t = int(owner[p])
        assert 0 <= t < token.shape[0] and int(token[t]) - TOKEN0 == int(want["atom_to_token_idx"][a]), (
            f"atom {a} (position {p}) names position {t}, which holds token {int(token[t]) - TOKEN0}"
            f" and not its token {int(want['atom_to_token_idx'][a])}")
        if "atom_to_token" in got:
            columns = got["atom_to_token"].full_tensor()[row][p].nonzero().flatten().tolist()
            assert columns == [t], f"atom {a}'s one-hot row names columns {columns}, not position {t}"
        checked += 1
    for q in range(token.shape[0]):
        if int(token[q]) < TOKEN0:
            continue
        s = int(token[q]) - TOKEN0
        for j in range(3):
            f, serial = int(frames[q, j]), int(want["frame_atom_index"][s, j])
            if serial == -1:
                assert f == -1, f"token {s}'s frame {j} is none but names {f}"
                continue
            assert int(atom[f]) - ATOM0 == serial, (
                f"token {s}'s frame {j} names position {f}, which holds atom {int(atom[f]) - ATOM0}"
                f" and not atom {serial}")
            checked += 1
    return checked


def _worker(rank: int, world: int, store: str, shape: tuple[int, ...], spec: str, results: str,
            lengths: tuple[int, int]) -> None:
    sys.path[:0] = [str(HERE)]
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    import featshard
    from featshard.data import collate
    from featshard.distribute import cp_group, distribute_features

    plan = featshard.Plan(spec)
    cp_names = tuple(plan.mesh_axes)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", *cp_names))
    out: dict[str, Any] = {"rank": rank}
    try:
        onehot = "atom_to_token" in plan.ir["features"]
        samples = [sample(n, seed, onehot) for seed, n in enumerate(lengths)]
        group = cp_group(plan, mesh)
        coord = mesh.get_coordinate()
        assert coord is not None
        mine = samples[coord[0]]
        got = distribute_features(plan, mine if rank == group.ranks[0] else None, mesh, group=group)
        batch = collate(plan, [got], mesh)
        # The replicas' blocks differ, so collate grew the smaller replica's.
        assert batch["token_serial"].to_local().shape[1] >= got["token_serial"].to_local().shape[0]
        out["checked"] = [check_replica(plan, batch, d, samples[d], shape[1]) for d in range(shape[0])]
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test process
        out["status"] = f"{type(e).__name__}: {e}"
    Path(results, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("shape,one_axis,windows", [
    ((2, 2), True, False), ((2, 2, 1), False, False), ((2, 2), True, True), ((2, 2, 1), False, True),
], ids=["dp2xcp2", "dp2xtile2x1", "dp2xcp2-windows", "dp2xtile2x1-windows"])
def test_collate_keeps_every_index_naming_its_item(
    tmp_path: Path, shape: tuple[int, ...], one_axis: bool, windows: bool
) -> None:
    world = 1
    for n in shape:
        world *= n
    spec = tmp_path / "ids.yaml"
    spec.write_text(spec_text(one_axis, windows))
    # Replica 0's sample is the smaller: its blocks grow in the batch.
    start_ranks(_worker, (world, str(tmp_path / "store"), shape, str(spec), str(tmp_path), (7, 13)), world)
    outs = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(world)]
    assert [o["status"] for o in outs] == ["ok"] * world, outs
    # Every atom and every frame of both samples was checked, on every rank.
    assert all(o["checked"][0] > 7 and o["checked"][1] > 13 for o in outs), outs
