"""A real AlphaFold3-family sample (Protenix 2.0.0's featurizer, tests/data/protenix)
through the Python package as the featurizer emits it: its nested `constraint_feature`
dict goes in as a dict and comes back as one; on gloo ranks `distribute_features` gives
each rank what `featshard.blocks` makes for it; and a layer stand-in that pools atoms
into their tokens by the delivered `atom_to_token_idx` (as those models do) gives the
serial result on a 2-D tile, on one CP axis and on dp x cp."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import start_ranks

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SPEC = ROOT / "examples" / "protenix.yaml"
SAMPLE = ROOT / "tests" / "data" / "protenix" / "small_complex.safetensors"


def nested_sample() -> dict[str, Any]:
    """The sample as the featurizer hands it over: `constraint_feature` a dict."""
    from safetensors.torch import load_file

    flat = load_file(SAMPLE)
    out: dict[str, Any] = {}
    for key, x in flat.items():
        head, _, tail = key.partition(".")
        if tail:
            out.setdefault(head, {})[tail] = x
        else:
            out[key] = x
    return out


def spec_file(one_axis: bool, folder: Path, windows: bool = False) -> Path:
    """The shipped spec (atoms in windows, with the atom attention's key halos); without
    `windows` the same in owner blocks (no `layout: windows`, no halo); on one axis its
    mesh line changed."""
    text = SPEC.read_text()
    if not windows:
        text = "".join(line for line in text.splitlines(keepends=True)
                       if "layout: windows" not in line and "derive: {halo:" not in line)
    if one_axis:
        text = text.replace("cp: [cp_axis_0, cp_axis_1]", "cp: [cp]")
    path = folder / f"protenix_{one_axis}_{windows}.yaml"
    path.write_text(text)
    return path


def pooled(ref_pos: Any, ids: Any, tokens: int) -> Any:
    """The layer stand-in: each token's mean reference position over its atoms, by the
    atoms' token ids (negative ids, pads, pooled nowhere)."""
    import torch

    keep = ids >= 0
    sums = torch.zeros(tokens, 3, dtype=torch.float64).index_add_(0, ids[keep], ref_pos[keep].double())
    counts = torch.zeros(tokens, dtype=torch.float64).index_add_(0, ids[keep], torch.ones(int(keep.sum()), dtype=torch.float64))
    return sums, counts


def same(got: Any, want: Any, where: str) -> None:
    import torch

    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for k in want:
            same(got[k], want[k], f"{where}.{k}")
        return
    local = got.to_local() if hasattr(got, "to_local") else got
    assert local.dtype == want.dtype and local.shape == want.shape, where
    assert torch.equal(local, want), where


def test_nested_dicts_go_in_and_come_back_nested() -> None:
    import featshard
    from featshard.blocks import rank_blocks
    from safetensors.torch import load_file

    plan = featshard.Plan(SPEC)
    nested = nested_sample()
    assert isinstance(nested["constraint_feature"], dict)
    for mesh in [(2, 2), (3, 3)]:
        from_nested = rank_blocks(plan, nested, mesh)
        from_flat = rank_blocks(plan, load_file(SAMPLE), mesh)
        for r, (a, b) in enumerate(zip(from_nested, from_flat)):
            assert sorted(a["constraint_feature"]) == ["contact", "contact_atom", "pocket", "substructure"]
            assert not any("." in k for k in a), sorted(a)
            same(a, b, f"{mesh} rank {r}")


def test_a_feature_given_nested_and_flat_is_refused_by_name() -> None:
    """`constraint_feature.pocket` in the nested dict and as a flat key with other values:
    refused naming the feature and both places, never the later one taken."""
    import featshard
    from featshard.blocks import rank_blocks

    plan = featshard.Plan(SPEC)
    sample = nested_sample()
    sample["constraint_feature.pocket"] = sample["constraint_feature"]["pocket"] + 1
    with pytest.raises(ValueError, match=r"feature `constraint_feature\.pocket`: given twice, as `pocket` in the dict"
                       r" `constraint_feature` and `constraint_feature\.pocket`: give it once"):
        rank_blocks(plan, sample, (2, 2))


def _worker(rank: int, world: int, store: str, shape: tuple[int, ...], spec: str, results: str) -> None:
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
    names = (("dp",) if len(shape) > len(cp_names) else ()) + cp_names
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    out: dict[str, Any] = {"rank": rank}
    try:
        group = cp_group(plan, mesh)
        source = rank == group.ranks[0]
        sample = nested_sample()
        cp = shape[-len(cp_names):]
        coord = mesh.get_coordinate()
        assert coord is not None
        at = coord[-1] if len(cp) == 1 else coord[-2] * cp[1] + coord[-1]
        got = distribute_features(plan, sample if source else None, mesh, group=group)
        want = rank_blocks(plan, sample, cp)[at]
        same(got, want, f"rank {rank}")
        # The stand-in, distributed: on a tile each rank pools its atoms into its own token
        # block by their shard-local ids; on one axis atoms lie in serial order with
        # global ids, so each rank pools into the whole token axis and the cp group sums.
        ids, pos = got["atom_to_token_idx"].to_local(), got["ref_pos"].to_local()
        token_block = got["token_index"].to_local().shape[0]
        tokens = token_block if len(cp) == 2 else token_block * cp[0]
        sums, counts = pooled(pos, ids, tokens)
        if len(cp) == 1:
            for x in (sums, counts):
                dist.all_reduce(x, group=group.group)
            lo = coord[-1] * token_block
            sums, counts = sums[lo:lo + token_block], counts[lo:lo + token_block]
        mine = got["token_index"].to_local()
        real = got["token_mask"].to_local()
        # Serially, from the sample as it came.
        serial_sums, serial_counts = pooled(sample["ref_pos"], sample["atom_to_token_idx"], sample["token_index"].shape[0])
        for k in range(token_block):
            if not bool(real[k]):
                assert counts[k] == 0, (rank, k)
                continue
            t = int(mine[k])
            assert counts[k] == serial_counts[t] and torch.equal(sums[k], serial_sums[t]), (rank, k, t)
        out["tokens"] = int(real.sum())
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test process
        out["status"] = f"{type(e).__name__}: {e}"
    Path(results, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("shape,one_axis", [((2, 2), False), ((3, 3), False), ((3,), True), ((8,), True),
                                            ((2, 3), True)],
                         ids=["tile2x2", "tile3x3", "cp3", "cp8", "dp2xcp3"])
def test_distribute_features_gives_the_blocks_and_atoms_pool_into_their_tokens(
    tmp_path: Path, shape: tuple[int, ...], one_axis: bool
) -> None:
    world = 1
    for n in shape:
        world *= n
    spec = spec_file(one_axis, tmp_path)
    start_ranks(_worker, (world, str(tmp_path / "store"), shape, str(spec), str(tmp_path)), world)
    outs = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(world)]
    assert [o["status"] for o in outs] == ["ok"] * world, outs
    # Every real token is some rank's: a tile row's ranks share theirs (cp1 copies).
    copies = shape[-1] if not one_axis else 1
    groups = world // (shape[-1] if one_axis else shape[-1] * shape[-2])
    assert sum(o["tokens"] for o in outs) == 46 * copies * groups, outs


def halo_spec(one_axis: bool, folder: Path) -> Path:
    """The shipped spec: windowed atoms and the key halos of the atom encoder's inputs
    (48 atoms a side, AlphaFold3's 128 keys around 32 queries)."""
    return spec_file(one_axis, folder, windows=True)


def _halo_worker(rank: int, world: int, store: str, shape: tuple[int, ...], spec: str, results: str) -> None:
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
    dp = len(shape) > len(cp_names)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=(("dp",) if dp else ()) + cp_names)
    out: dict[str, Any] = {"rank": rank}
    try:
        group = cp_group(plan, mesh)
        sample = nested_sample()
        got = distribute_features(plan, sample if rank == group.ranks[0] else None, mesh, group=group)
        full = mesh.get_coordinate()
        assert full is not None
        coord, cp = (full[1:], shape[1:]) if dp else (full, shape)
        at = coord[0] if len(cp) == 1 else coord[0] * cp[1] + coord[1]
        same(got, rank_blocks(plan, sample, cp)[at], f"rank {rank}")
        if dp:
            # Collated over the DP replicas: each sample's halo as it came, the batch axis
            # in front, a halo per shard of the atom axis in the global shape.
            from featshard.data import collate

            batch = collate(plan, [got], mesh)["ref_pos_keys"]
            assert torch.equal(batch.to_local()[0], got["ref_pos_keys"].to_local())
            assert tuple(batch.shape) == (shape[0], 96 * cp[0], 3), batch.shape
        # Each halo (dense, one-hot, of the derived atom mask) is the atoms around this
        # rank's block of the whole (padded) axis.
        halos = sorted(k for k in got if k.endswith("_keys"))
        assert len(halos) == 7, halos
        for name in halos:
            keys, of = got[name], got[name.removesuffix("_keys")]
            assert tuple(keys.placements) == tuple(of.placements), (name, keys.placements)
            whole = of.full_tensor()
            block = of.to_local().shape[0]
            start = coord[0] * block
            pad = torch.zeros((48, *whole.shape[1:]), dtype=whole.dtype)
            before = torch.cat([pad, whole])[start:start + 48]
            after = torch.cat([whole, pad])[start + block:start + block + 48]
            assert torch.equal(keys.to_local(), torch.cat([before, after])), f"rank {rank}: {name}"
            assert keys.shape[0] == 96 * cp[0], (name, keys.shape)
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test process
        out["status"] = f"{type(e).__name__}: {e}"
    Path(results, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("shape,one_axis", [((2, 2), False), ((3,), True), ((2, 2), True)],
                         ids=["tile2x2", "cp3", "dp2xcp2"])
def test_the_key_halo_reaches_each_rank_beside_its_block(tmp_path: Path, shape: tuple[int, ...], one_axis: bool) -> None:
    world = 1
    for n in shape:
        world *= n
    spec = halo_spec(one_axis, tmp_path)
    start_ranks(_halo_worker, (world, str(tmp_path / "store"), shape, str(spec), str(tmp_path)), world)
    outs = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(world)]
    assert [o["status"] for o in outs] == ["ok"] * world, outs
