"""`featshard.distribute`: the package's distribute on gloo ranks in separate processes
gives every rank its block of the reference padding (`oracle`) as a DTensor with the
module's placements and the global shape its splits give, the blocks made by the byte
executor and sent one rank at a time; a bad sample raises the same error on every rank."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import start_ranks

HERE = Path(__file__).resolve().parent
SPEC = HERE.parents[1] / "examples" / "boltz2.yaml"


def _worker(rank: int, world: int, store: str, gen_dir: str, shape: tuple[int, ...],
            results: str) -> None:
    sys.path[:0] = [gen_dir, str(HERE)]
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    names = ("dp", "cp_axis_0", "cp_axis_1") if len(shape) == 3 else ("cp_axis_0", "cp_axis_1")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    import boltz2_placements as P
    import featshard
    import oracle
    from boltz_samples import (
        as_elements,
        as_indices,
        as_narrow,
        random_sample,
        real_samples,
    )
    from featshard.distribute import cp_group, distribute_features

    plan = featshard.Plan(SPEC)
    group = cp_group(plan, mesh)
    source = rank == group[1][0]
    coord = mesh.get_coordinate()
    assert coord is not None
    dp = coord[0] if len(shape) == 3 else 0
    cp = (shape[-2], shape[-1])
    out: dict[str, Any] = {"rank": rank}
    try:
        samples = [random_sample(P, 11 + dp, seed=200 + dp), *real_samples()[:1]]
        # Then each one's one-hot features reach the source as indices, its sparse
        # features as their elements, its masks as bool and ranged ids as uint8: same
        # DTensors.
        compact_input = [(as_narrow(as_elements(as_indices(s))), s) for s in samples]
        for given, sample in [(s, s) for s in samples] + compact_input:
            want = oracle.rank_blocks(P, sample, cp)[coord[-2] * cp[1] + coord[-1]]
            got = distribute_features(plan, given if source else None, mesh,
                                      workflow="inference", threads=2, group=group)
            tensors = sorted(n for n, x in got.items() if isinstance(x, torch.Tensor))
            assert tensors == sorted(want), sorted(set(tensors) ^ set(want))
            for name in sorted(set(got) - set(want)):
                assert name in P.METADATA_FEATURES and got[name] == sample[name], name
            for name, w in want.items():
                g = got[name]
                assert tuple(g.placements) == P.PLACEMENTS[name], name
                local = g.to_local()
                split = [n * cp[s[1]] if s is not None and s[0] == "mesh" else n
                         for n, s in zip(local.shape, P.SPLITS[name])]
                assert list(g.shape) == split, (name, list(g.shape), split)
                row_major = [math.prod(split[d + 1:]) for d in range(len(split))]
                assert list(g.stride()) == row_major, (name, g.stride(), split)
                assert local.dtype == w.dtype and local.shape == w.shape, name
                assert torch.equal(local.view(torch.uint8) if local.dtype != torch.bool else local,
                                   w.view(torch.uint8) if w.dtype != torch.bool else w), name
        out["alive"] = _buffers_alive_when_written(plan, samples[0] if source else None, mesh, group)
        bad = dict(samples[0], ref_pos=samples[0]["ref_pos"].double())
        try:
            distribute_features(plan, bad if source else None, mesh, workflow="inference",
                                group=group)
            out["error"] = None
        except ValueError as e:
            out["error"] = str(e)
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test process
        out["status"] = f"{type(e).__name__}: {e}"
    Path(results, f"rank-{rank}.json").write_text(json.dumps(out))
    # Nobody tears down gloo while a peer may still be using its connections.
    dist.barrier()
    dist.destroy_process_group()


def _buffers_alive_when_written(plan: Any, sample: Any, mesh: Any, group: Any) -> list[int]:
    """How many buffers the source wrote earlier are still alive as it writes each next
    one (its memory reused, not new, when none is)."""
    import weakref

    import featshard.distribute as D

    written, alive = [], []
    original = D._written

    def counted(*args: Any) -> Any:
        alive.append(sum(w() is not None for w in written))
        buffer, late = original(*args)
        written.append(weakref.ref(buffer))
        return buffer, late

    D._written = counted
    try:
        D.distribute_features(plan, sample, mesh, workflow="inference", group=group)
    finally:
        D._written = original
    return alive


@pytest.mark.parametrize("shape", [(2, 2), (2, 1, 2)], ids=["2x2", "dp2x1x2"])
def test_the_package_gives_every_rank_its_reference_block_as_a_dtensor(
    generated_dir: Path, tmp_path: Path, shape: tuple[int, ...]
) -> None:
    world = 1
    for n in shape:
        world *= n
    start_ranks(_worker, (world, str(tmp_path / "store"), str(generated_dir), shape, str(tmp_path)), world)
    outs = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(world)]
    assert [o["status"] for o in outs] == ["ok"] * world, outs
    # The source writes every rank's buffer, its own last, each once the one before it
    # is freed; the others write none.
    cp = shape[-2] * shape[-1]
    assert sorted(o["alive"] for o in outs) == [[]] * (world - world // cp) + [[0] * cp] * (world // cp), outs
    errors = {o["error"] for o in outs}
    assert len(errors) == 1 and "feature `ref_pos`" in str(errors.pop()), outs
