"""OpenFold3's real output (tests/data/openfold3: plain, padded to a token budget, a
collated batch's row) through the Python package as its pipeline hands it on: on gloo
ranks `distribute_features` gives each rank what `featshard.blocks` makes for it; a
layer stand-in pooling atoms into their tokens by the delivered `atom_to_token_index`
gives the serial result; and each real token's delivered `start_atom_index` names, in
the gathered atom axis, the featurizer's first atom of that token."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import start_ranks

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SPEC = ROOT / "examples" / "openfold3.yaml"


def sample_of(form: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(ROOT / "tests" / "data" / "openfold3" / f"{form}.safetensors"))


def spec_file(form: str, one_axis: bool, windows: bool, folder: Path) -> Path:
    """The shipped spec; on one axis its mesh line changed; with `windows` its atoms in
    serial windows; for the collated form its `[1]` settings scalars."""
    text = SPEC.read_text()
    if one_axis:
        text = text.replace("cp: [cp_axis_0, cp_axis_1]", "cp: [cp]")
    if windows:
        text = text.replace("    window: 32 ", "    layout: windows\n    window: 32 ", 1)
    if form == "collated":
        text = text.replace("axes: [1]", "axes: []")
    path = folder / f"openfold3_{form}_{one_axis}_{windows}.yaml"
    path.write_text(text)
    return path


def pooled(ref_pos: Any, ids: Any, real: Any, tokens: int) -> tuple[Any, Any]:
    """The layer stand-in: each token's summed reference positions and atom count, by the
    real atoms' token ids."""
    import torch

    keep = real.bool()
    sums = torch.zeros(tokens, 3, dtype=torch.float64).index_add_(0, ids[keep].long(), ref_pos[keep].double())
    ones = torch.ones(int(keep.sum()), dtype=torch.float64)
    counts = torch.zeros(tokens, dtype=torch.float64).index_add_(0, ids[keep].long(), ones)
    return sums, counts


def _worker(rank: int, world: int, store: str, shape: tuple[int, ...], spec: str, form: str, results: str) -> None:
    sys.path[:0] = [str(HERE)]
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    import featshard
    from featshard.blocks import rank_blocks
    from featshard.distribute import cp_group, distribute_features

    plan = featshard.Plan(spec)
    cp_names = tuple(plan.mesh_axes)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=cp_names)
    out: dict[str, Any] = {"rank": rank}
    try:
        group = cp_group(plan, mesh)
        sample = sample_of(form)
        coord = mesh.get_coordinate()
        assert coord is not None
        at = coord[0] if len(shape) == 1 else coord[0] * shape[1] + coord[1]
        got = distribute_features(plan, sample if rank == group.ranks[0] else None, mesh, group=group)
        want = rank_blocks(plan, sample, shape)[at]
        for k, x in want.items():
            assert torch.equal(got[k].to_local(), x), (rank, k)
        # Serially, from the sample's real items.
        n_tok = int(sample["token_mask"].sum())
        n_atom = int(sample["atom_mask"].sum())
        serial_pos = sample["ref_pos"][:n_atom]
        serial_sums, serial_counts = pooled(serial_pos, sample["atom_to_token_index"][:n_atom],
                                            torch.ones(n_atom), n_tok)
        ids, pos, real = (got[k].to_local() for k in ("atom_to_token_index", "ref_pos", "atom_mask"))
        mine, token_real = got["token_index"].to_local(), got["token_mask"].to_local()
        block = mine.shape[0]
        tile = len(shape) == 2 and "layout: windows" not in Path(spec).read_text()
        tokens = block if tile else block * shape[0]
        sums, counts = pooled(pos, ids, real, tokens)
        if not tile:
            # Global ids: every rank pools into the whole token axis, the group sums (on a
            # tile in windows each cp1 rank of a row holds the row's atoms: one share).
            copies = shape[1] if len(shape) == 2 else 1
            for x in (sums, counts):
                dist.all_reduce(x, group=group.group)
                x /= copies
            lo = coord[0] * block
            sums, counts = sums[lo:lo + block], counts[lo:lo + block]
        whole_pos = got["ref_pos"].full_tensor()
        starts = got["start_atom_index"].to_local()
        first = sample["start_atom_index"]
        for k in range(block):
            if not bool(token_real[k]):
                assert counts[k] == 0, (rank, k)
                continue
            t = int(mine[k])
            assert counts[k] == serial_counts[t] and torch.equal(sums[k], serial_sums[t]), (rank, k, t)
            assert torch.equal(whole_pos[int(starts[k])], serial_pos[int(first[t])]), (rank, k, t)
        out["tokens"] = int(token_real.sum())
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test process
        out["status"] = f"{type(e).__name__}: {e}"
    Path(results, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("form", ["plain", "padded", "collated"])
@pytest.mark.parametrize("shape,windows", [((2, 2), False), ((2, 3), True), ((3,), False), ((4,), True)],
                         ids=["tile2x2", "tile2x3-windows", "cp3", "cp4-windows"])
def test_every_form_reaches_its_ranks_and_atoms_pool_into_their_tokens(
    tmp_path: Path, form: str, shape: tuple[int, ...], windows: bool
) -> None:
    world = 1
    for n in shape:
        world *= n
    spec = spec_file(form, len(shape) == 1, windows, tmp_path)
    start_ranks(_worker, (world, str(tmp_path / "store"), shape, str(spec), form, str(tmp_path)), world)
    outs = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(world)]
    assert [o["status"] for o in outs] == ["ok"] * world, outs
    copies = shape[1] if len(shape) == 2 else 1
    assert sum(o["tokens"] for o in outs) == 72 * copies, outs
