"""Faults during online distribution, on gloo ranks whose default group has a timeout of a
few seconds: a rank that dies before or during a step, a source that dies midway, ranks
that disagree on the source, the mesh, its order, its names, the spec or the workflow.
Every surviving rank ends with a named error: the ranks that can still agree raise the
same `FeatureDistributionError` naming both sides; the ranks left waiting on a dead
peer raise a `CollectiveError` within the groups' timeout. A rank still running at the
harness's deadline is a hang, and fails the test."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_ranks

HERE = Path(__file__).resolve().parent

# Every group's timeout in these worlds, in seconds.
TIMEOUT = 3
# A world that has not ended by then hangs (rank start-up included, on a loaded machine).
DEADLINE = 90

SPEC = """\
version: 1
module: faults
mesh: {cp: [cp0, cp1], dp: dp}
semantics:
  tokens: {shard: true}
workflows: [training, inference]
features:
  token_mask: {axes: [tokens], dtype: float32, mask: tokens}
  pair: {axes: [tokens, tokens], dtype: float32}
  labels: {axes: [tokens], dtype: int64, only: [training]}
"""


def _specs(folder: Path) -> dict[str, str]:
    """The spec, one that lacks a feature, the spec on one CP axis, and one that names a
    feature otherwise."""
    texts = {
        "spec": SPEC,
        "lacking": SPEC.replace("  labels: {axes: [tokens], dtype: int64, only: [training]}\n", ""),
        "one_axis": SPEC.replace("cp: [cp0, cp1]", "cp: [cp]"),
        "renamed": SPEC.replace("  pair:", "  other_pair:"),
    }
    paths = {}
    for name, text in texts.items():
        path = folder / f"{name}.yaml"
        path.write_text(text)
        paths[name] = str(path)
    return paths


def _sample(workflow: str) -> dict[str, Any]:
    import torch

    n = 6
    sample = {"token_mask": torch.ones(n), "pair": torch.arange(n * n, dtype=torch.float32).view(n, n)}
    if workflow == "training":
        sample["labels"] = torch.arange(n)
    return sample


def _die() -> None:
    """This rank crashes (no exception, no clean-up: its peers see it go)."""
    os.kill(os.getpid(), signal.SIGKILL)


def _worker(rank: int, world: int, store: str, specs: dict[str, str], results: str, case: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    sys.path[:0] = [str(HERE)]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT))
    outcomes: list[str] = []
    for step in CASES[case]:
        try:
            outcomes.append(step(rank, specs))
        except Exception as e:  # noqa: BLE001 - reported to the test process
            outcomes.append(f"{type(e).__name__}: {e}")
    Path(results, f"rank-{rank}.json").write_text(json.dumps(outcomes))
    # No clean-up: a peer may be dead, and tearing down would wait on it.
    os._exit(0)


def _mesh(shape: tuple[int, ...], names: tuple[str, ...], order: list[int] | None = None) -> Any:
    """A device mesh over the world: made collectively, or (with ``order``, or names no
    other rank gives) held by this rank alone without process groups of its own."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if order is None:
        return init_device_mesh("cpu", shape, mesh_dim_names=names)
    return DeviceMesh("cpu", torch.tensor(order).view(shape), mesh_dim_names=names, _init_backend=False)


def _step(rank: int, specs: dict[str, str], *, spec: str = "spec", src: int | None = None,
          workflow: str = "inference", mesh: Any = None) -> str:
    """One distribution step of the sample on the (2, 2) mesh (or ``mesh``)."""
    import featshard
    from featshard.distribute import distribute_features

    plan = featshard.Plan(specs[spec])
    mesh = mesh if mesh is not None else _mesh((2, 2), ("cp0", "cp1"))
    source = rank == (0 if src is None else src)
    got = distribute_features(plan, _sample(workflow) if source else None, mesh, src=src, workflow=workflow)
    return "ok " + ",".join(sorted(got))


def _groups_take_the_callers_timeout(rank: int, specs: dict[str, str]) -> str:
    import featshard
    from featshard.data import cpu_mesh_like
    from featshard.distribute import cp_group
    from featshard.errors import timeout_of

    mesh = _mesh((2, 2), ("cp0", "cp1"))
    group = cp_group(featshard.Plan(specs["spec"]), mesh)
    cpu = cpu_mesh_like(mesh)
    found = {timeout_of(g) for g in (group.group, group.world, cpu.get_group("cp0"), cpu.get_group("cp1"))}
    return "timeouts " + ",".join(sorted(str(t.total_seconds()) if t else "unknown" for t in found))


def _receiver_dies_before(rank: int, specs: dict[str, str]) -> str:
    import featshard
    from featshard.distribute import cp_group

    mesh = _mesh((2, 2), ("cp0", "cp1"))
    cp_group(featshard.Plan(specs["spec"]), mesh)
    if rank == 3:
        _die()
    return _step(rank, specs, mesh=mesh)


def _receiver_dies_during(rank: int, specs: dict[str, str]) -> str:
    import featshard.distribute as D

    mesh = _mesh((2, 2), ("cp0", "cp1"))
    if rank == 3:
        D._receive_blocks = lambda *args: _die()  # type: ignore[assignment]
    return _step(rank, specs, mesh=mesh)


def _source_dies_midway(rank: int, specs: dict[str, str]) -> str:
    import featshard.distribute as D

    mesh = _mesh((2, 2), ("cp0", "cp1"))
    if rank == 0:
        # Rank 1 has its header; the source dies before writing its blocks.
        D._written = lambda *args: _die()  # type: ignore[assignment]
    return _step(rank, specs, mesh=mesh)


def _receiver_stalls(rank: int, specs: dict[str, str]) -> str:
    import time

    import featshard
    from featshard.distribute import cp_group

    mesh = _mesh((2, 2), ("cp0", "cp1"))
    cp_group(featshard.Plan(specs["spec"]), mesh)
    if rank == 3:
        # Alive, but elsewhere for longer than the groups wait.
        time.sleep(3 * TIMEOUT)
    return _step(rank, specs, mesh=mesh)


def _sources_differ(rank: int, specs: dict[str, str]) -> str:
    return _step(rank, specs, src=0 if rank < 2 else 1)


def _specs_differ(rank: int, specs: dict[str, str]) -> str:
    return _step(rank, specs, spec="lacking" if rank == 3 else "spec")


def _workflows_differ(rank: int, specs: dict[str, str]) -> str:
    return _step(rank, specs, workflow="training" if rank == 2 else "inference")


def _mesh_orders_differ(rank: int, specs: dict[str, str]) -> str:
    order = [0, 1, 2, 3] if rank < 2 else [0, 2, 1, 3]
    return _step(rank, specs, mesh=_mesh((2, 2), ("cp0", "cp1"), order))


def _names_differ(rank: int, specs: dict[str, str]) -> str:
    names = ("cp0", "cp1") if rank != 2 else ("rows", "cols")
    return _step(rank, specs, mesh=_mesh((2, 2), names, [0, 1, 2, 3]))


def _dp_mesh_against_cp_mesh(rank: int, specs: dict[str, str]) -> str:
    mesh = _mesh((2, 2), ("dp", "cp"))
    return _step(rank, specs, spec="one_axis", mesh=mesh if rank < 2 else mesh["cp"])


def _a_dtensor_given_as_a_value(rank: int, specs: dict[str, str]) -> str:
    import featshard
    from featshard.distribute import distribute_features
    from torch.distributed.tensor import DTensor, Replicate

    mesh = _mesh((2, 2), ("cp0", "cp1"))
    sample = _sample("inference")
    sample["pair"] = DTensor.from_local(sample["pair"], mesh, (Replicate(), Replicate()))
    distribute_features(featshard.Plan(specs["spec"]), sample if rank == 0 else None, mesh,
                        workflow="inference")
    return "distributed a DTensor's memory"


def _a_hook_fails_with_undecodable_text(rank: int, specs: dict[str, str]) -> str:
    import featshard
    from featshard.distribute import distribute_features

    def check(blocks: Any) -> None:
        if rank == 1:
            raise ValueError("cannot read " + os.fsdecode(b"\xff.safetensors"))

    mesh = _mesh((2, 2), ("cp0", "cp1"))
    distribute_features(featshard.Plan(specs["spec"]), _sample("inference") if rank == 0 else None,
                        mesh, workflow="inference", check=check)
    return "the hook's failure was lost"


def _marked_values_reach_every_rank_resolved(rank: int, specs: dict[str, str]) -> str:
    import featshard
    import torch
    from featshard.distribute import distribute_features

    mesh = _mesh((2, 2), ("cp0", "cp1"))
    plan = featshard.Plan(specs["spec"])
    sample = _sample("inference")
    want = distribute_features(plan, sample if rank == 0 else None, mesh, workflow="inference")
    lazy = dict(sample, pair=(-sample["pair"])._neg_view(),
                token_mask=torch.complex(torch.zeros(6), -sample["token_mask"]).conj().imag)
    got = distribute_features(plan, lazy if rank == 0 else None, mesh, workflow="inference")
    same = all(torch.equal(got[n].to_local(), want[n].to_local()) for n in want)
    return "resolved" if same else "memory shipped"


def _collate(rank: int, specs: dict[str, str]) -> str:
    """DP collate of batches one replica cannot collate, on (dp, cp0, cp1) = (2, 1, 2):
    each is every rank's named error (or, for plain tensors, a right result)."""
    import featshard
    import torch
    from featshard.data import collate
    from featshard.distribute import distribute_features

    mesh = _mesh((2, 1, 2), ("dp", "cp0", "cp1"))
    plan = featshard.Plan(specs["spec"])
    replica = rank // 2
    source = rank % 2 == 0

    def sample(workflow: str) -> dict[str, Any]:
        return distribute_features(plan, _sample(workflow) if source else None, mesh, workflow=workflow)

    inference, training = sample("inference"), sample("training")
    renamed = {"other_pair" if n == "pair" else n: x for n, x in _sample("inference").items()}
    other = distribute_features(featshard.Plan(specs["renamed"]), renamed if source else None, mesh,
                                workflow="inference")
    batches: dict[str, list[Any]] = {
        "empty": [inference] if replica == 0 else [],
        "mixed": [inference, training] if replica == 0 else [inference, inference],
        "sizes": [inference, inference] if replica == 0 else [inference],
        "late metadata": [inference, dict(inference, record="x")],
        "foreign": [dict(inference, other_pair=other["other_pair"])],
        "plain": [dict(inference, t=torch.full((3,), float(replica))), dict(inference, t=torch.ones(3))],
    }
    outcomes = []
    for what, batch in batches.items():
        try:
            got = collate(plan, batch, mesh)
            outcomes.append(f"{what}: ok {sorted(got)} {got['t'].tolist() if 't' in got else ''}")
        except Exception as e:  # noqa: BLE001 - compared across ranks by the test
            outcomes.append(f"{what}: {type(e).__name__}: {e}")
    return "\n".join(outcomes)


def _after_all_a_good_step(rank: int, specs: dict[str, str]) -> str:
    return _step(rank, specs)


CASES: dict[str, list[Callable[[int, dict[str, str]], str]]] = {
    "receiver_dies_before": [_receiver_dies_before],
    "receiver_dies_during": [_receiver_dies_during],
    "source_dies_midway": [_source_dies_midway],
    "receiver_stalls": [_receiver_stalls],
    # No rank dies: each disagreement is every rank's error, and the world goes on.
    "disagreements": [
        _groups_take_the_callers_timeout,
        _sources_differ,
        _specs_differ,
        _workflows_differ,
        _mesh_orders_differ,
        _names_differ,
        _dp_mesh_against_cp_mesh,
        _a_dtensor_given_as_a_value,
        _a_hook_fails_with_undecodable_text,
        _marked_values_reach_every_rank_resolved,
        _collate,
        _after_all_a_good_step,
    ],
}


def _run(tmp_path: Path, case: str, world: int = 4) -> tuple[list[int | None], dict[int, list[str]]]:
    store = tmp_path / "store"
    specs = _specs(tmp_path)
    codes = run_ranks(_worker, (world, str(store), specs, str(tmp_path), case), world, deadline=DEADLINE)
    hung = [r for r, c in enumerate(codes) if c is None]
    assert not hung, f"ranks {hung} still waited after {DEADLINE} s"
    outs = {r: json.loads(p.read_text()) for r in range(world) if (p := tmp_path / f"rank-{r}.json").exists()}
    return codes, outs


def _peer_lost(outcome: str) -> bool:
    return outcome.startswith("CollectiveError: ") and f"(the group's timeout is {TIMEOUT} s)" in outcome


@pytest.mark.parametrize("case,dead", [
    ("receiver_dies_before", 3),
    ("receiver_dies_during", 3),
    ("source_dies_midway", 0),
])
def test_a_rank_that_dies_ends_every_survivors_step_within_the_timeout(tmp_path: Path, case: str, dead: int) -> None:
    codes, outs = _run(tmp_path, case)
    assert codes[dead] == -signal.SIGKILL and dead not in outs, (codes, outs)
    survivors = [r for r in range(4) if r != dead]
    assert sorted(outs) == survivors, outs
    for r in survivors:
        assert len(outs[r]) == 1 and _peer_lost(outs[r][0]), (r, outs[r])


def test_a_rank_that_stalls_past_the_timeout_is_every_ranks_named_error(tmp_path: Path) -> None:
    codes, outs = _run(tmp_path, "receiver_stalls")
    assert codes == [0, 0, 0, 0] and sorted(outs) == [0, 1, 2, 3], (codes, outs)
    for r in range(3):
        assert _peer_lost(outs[r][0]) and "agreeing on the step's terms" in outs[r][0], (r, outs[r])
    # The late rank finds its peers gone.
    assert outs[3][0].startswith("CollectiveError: "), outs[3]


def test_ranks_that_disagree_are_each_told_both_sides_and_the_world_goes_on(tmp_path: Path) -> None:
    codes, outs = _run(tmp_path, "disagreements")
    assert codes == [0, 0, 0, 0] and sorted(outs) == [0, 1, 2, 3], (codes, outs)
    steps = list(zip(*(outs[r] for r in range(4))))
    timeouts, sources, specs, workflows, orders, names, dp_cp, dtensor, surrogate, marked, collated, good = steps
    assert set(timeouts) == {f"timeouts {float(TIMEOUT)}"}, timeouts
    expect = {
        "sources": (sources, "ranks disagree on the source: rank 0 has CP group rank 0, rank 2 has CP group rank 1"),
        "specs": (specs, "ranks disagree on the spec (sha256): rank 0 has `"),
        "workflows": (workflows, "ranks disagree on the workflow: rank 0 has `inference`, rank 2 has `training`"),
        "orders": (orders, "ranks disagree on the mesh's rank order: rank 0 has [0, 1, 2, 3], rank 2 has [0, 2, 1, 3]"),
        "dp_cp": (dp_cp, "ranks disagree on the mesh: rank 0 has `dp=2, cp=2`, rank 2 has `cp=2`"),
    }
    for what, (got, message) in expect.items():
        assert len(set(got)) == 1, (what, got)
        assert got[0].startswith("FeatureDistributionError: " + message), (what, got[0])
    # A mesh named otherwise is refused by its rank, and every rank raises that.
    assert len(set(names)) == 1 and "mesh" in names[0] and "rows" in names[0], names
    # A DTensor as a sample value is refused by name, on every rank.
    refused = ("TypeError: feature `pair`: expected a float32 tensor, got a DTensor"
               " (a distributed tensor's block: give the serial sample, e.g. .full_tensor())")
    assert set(dtensor) == {refused}, dtensor
    # Any text reaches every rank, an undecodable byte as its escape.
    assert set(surrogate) == {"ValueError: cannot read \\udcff.safetensors"}, surrogate
    assert set(marked) == {"resolved"}, marked
    # A batch one replica cannot collate is every rank's same error, naming it.
    per_rank = [c.split("\n") for c in collated]
    assert all(len(p) == 6 for p in per_rank), collated
    for case in zip(*per_rank):
        what = case[0].split(":")[0]
        if what != "plain":
            assert len(set(case)) == 1, case
    empty, mixed, sizes, late, foreign, plain = per_rank[0]
    assert empty == "empty: FeatureDistributionError: collate: empty batch", empty
    assert mixed.startswith("mixed: FeatureDistributionError: collate: the samples of a batch hold"
                            " different features"), mixed
    assert sizes.startswith("sizes: FeatureDistributionError: collate: DP replicas collate batches of"
                            " different sizes, from 1 to 2 samples"), sizes
    assert late == ("late metadata: FeatureDistributionError: collate: sample 1 holds `record`, sample 0"
                    " does not: the samples of a batch hold the same keys"), late
    assert foreign.startswith("foreign: FeatureDistributionError: collate: sample 0 holds a DTensor"
                              " `other_pair`, which the spec `faults` does not place"), foreign
    # Plain tensors are stacked, each replica its own.
    assert per_rank[0][5] == "plain: ok ['pair', 't', 'token_mask'] [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]", plain
    assert per_rank[2][5] == "plain: ok ['pair', 't', 'token_mask'] [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]", per_rank[2]
    assert set(good) == {"ok pair,token_mask"}, good
