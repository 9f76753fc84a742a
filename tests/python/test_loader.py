"""featshard.loader.FeatureLoader on gloo ranks: samples made in worker processes, by
the group's ranks in turn, distributed ahead of the caller, give the same samples in the
same order with the same blocks as the synchronous loader (a DataLoader over
DistributedFeatureDataset); a failure in one worker is every rank's at that step; no
worker process or shared memory is left; what a rank holds ahead is bounded."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import start_ranks

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SPEC = ROOT / "examples" / "protenix.yaml"
SAMPLE = ROOT / "tests" / "data" / "protenix" / "small_complex.safetensors"
SAMPLES = 5

# (mesh shape, one CP axis, batch size): a tile, one axis, DP replicas (batched).
MESHES = [((2, 2), False, None), ((3,), True, None), ((2, 2), True, 2)]
# Loader options against the synchronous path: workers on the source; sources spread
# over the group with workers and two steps distributed ahead.
VARIANTS = [
    {"num_workers": 1, "spread": False},
    {"num_workers": 1, "spread": True, "prefetch": 2},
]


class Serial:
    """The real Protenix sample, its reference positions moved by the index (so that
    order shows), as a featurizer gives it. Index 3 fails when ``failing``. Each fetch
    counts in ``fetched`` (shared with worker processes)."""

    def __init__(self, failing: bool = False, fetched: Any = None) -> None:
        from safetensors.torch import load_file

        self.flat = load_file(SAMPLE)
        self.failing = failing
        self.fetched = fetched

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.fetched is not None:
            with self.fetched.get_lock():
                self.fetched.value += 1
        if self.failing and i == 3:
            raise OSError(f"sample {i}: featurizer failed")
        from test_protenix import nested_sample

        out = nested_sample()
        out["ref_pos"] = out["ref_pos"] + i
        return out


def _flat(step: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, x in step.items():
        if isinstance(x, dict):
            out.update(_flat(x, f"{prefix}{k}."))
        else:
            out[prefix + k] = x
    return out


def _same_steps(got: list[Any], want: list[Any], where: str) -> None:
    import torch

    assert len(got) == len(want), f"{where}: {len(got)} steps, not {len(want)}"
    for s, (g, w) in enumerate(zip(got, want)):
        g, w = _flat(g), _flat(w)
        assert sorted(g) == sorted(w), f"{where} step {s}"
        for k in w:
            a, b = g[k], w[k]
            if hasattr(b, "to_local"):
                assert (a.shape, tuple(a.placements)) == (b.shape, tuple(b.placements)), f"{where} step {s} {k}"
                a, b = a.to_local(), b.to_local()
            if isinstance(b, torch.Tensor):
                assert a.dtype == b.dtype and torch.equal(a, b), f"{where} step {s} {k}"
            else:
                assert a == b, f"{where} step {s} {k}"


def _children() -> list[int]:
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children() if p.pid is not None]


def _shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("torch_")} if os.path.isdir("/dev/shm") else set()


def _worker(rank: int, world: int, store: str, shape: tuple[int, ...], one_axis: bool,
            batch: int | None, scenario: str, results: str) -> None:
    sys.path[:0] = [str(HERE)]
    import multiprocessing
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils.data import DataLoader

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=90))
    import featshard
    from featshard.data import DistributedFeatureDataset, collate, dp_sampler
    from featshard.loader import FeatureLoader

    spec = SPEC
    if one_axis:
        spec = Path(results) / "protenix_1d.yaml"
        if rank == 0:
            spec.write_text(SPEC.read_text().replace("cp: [cp_axis_0, cp_axis_1]", "cp: [cp]"))
        dist.barrier()
    plan = featshard.Plan(spec)
    cp_names = tuple(plan.mesh_axes)
    names = (("dp",) if len(shape) > len(cp_names) else ()) + cp_names
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    out: dict[str, Any] = {"rank": rank}
    shm_before = _shm()
    try:
        if scenario == "parity":
            dataset = DistributedFeatureDataset(plan, Serial(), mesh, workflow=None)
            sampler = dp_sampler(plan, dataset, mesh, shuffle=True, seed=7)
            reference = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=0,
                                   collate_fn=None if batch is None else (lambda b: collate(plan, b, mesh)))
            want = list(reference)
            for options in VARIANTS:
                loader = FeatureLoader(plan, Serial(), mesh, batch_size=batch, shuffle=True, seed=7,
                                       **options)  # type: ignore[arg-type]
                _same_steps(list(loader), want, f"rank {rank} {options}")
                assert not _children(), f"{options}: worker processes left"
        elif scenario == "resume":
            # Interrupted at step 2 of epoch 1 (workers and steps made ahead in flight),
            # resumed by a new loader from the state: the steps of an uninterrupted epoch.
            options: dict[str, Any] = {"num_workers": 1, "spread": True, "prefetch": 2}
            full = FeatureLoader(plan, Serial(), mesh, batch_size=batch, shuffle=True, seed=7, **options)
            full.set_epoch(1)
            want = list(full)
            first = FeatureLoader(plan, Serial(), mesh, batch_size=batch, shuffle=True, seed=7, **options)
            first.set_epoch(1)
            got, steps = [], iter(first)
            for _ in range(2):
                got.append(next(steps))
            state = first.state_dict()
            del steps
            assert state["steps"] == 2 and state["epoch"] == 1, state
            resumed = FeatureLoader(plan, Serial(), mesh, batch_size=batch, shuffle=True, seed=7, **options)
            resumed.load_state_dict(state)
            got += list(resumed)
            _same_steps(got, want, f"rank {rank} resumed")
            assert resumed.state_dict()["steps"] == len(want), resumed.state_dict()
            # Its counters: the steps taken, and the caller's waits for the ones it made.
            c = resumed.counters
            assert c["steps"] == len(want) and 0 <= c["stall_median_s"] <= c["stall_max_s"] <= c["stall_s"], c
            other = FeatureLoader(plan, Serial(), mesh, batch_size=batch, shuffle=True, seed=8, **options)
            try:
                other.load_state_dict(state)
                raise AssertionError("a state of another seed was taken")
            except ValueError as e:
                out["refused"] = str(e)
            assert not _children(), "worker processes left"
        elif scenario == "failure":
            loader = FeatureLoader(plan, Serial(failing=True), mesh, num_workers=1, spread=True, prefetch=1)
            seen = 0
            try:
                for _ in loader:
                    seen += 1
            except OSError as e:
                out["error"] = str(e)
            out["steps_before"] = seen
            out["children"] = len(_children())
        elif scenario == "interrupt":
            # Every rank's loop is interrupted at its third step (Ctrl-C), the loader
            # dropped with workers busy and a step distributed ahead.
            loader = FeatureLoader(plan, Serial(), mesh, num_workers=1, spread=True, prefetch=1)
            try:
                for step, _ in enumerate(loader):
                    if step == 2:
                        raise KeyboardInterrupt
            except KeyboardInterrupt:
                pass
            out["children"] = len(_children())
        elif scenario == "bound":
            fetched = multiprocessing.Value("i", 0)
            workers, factor, ahead = 1, 2, 1
            loader = FeatureLoader(plan, Serial(fetched=fetched), mesh, num_workers=workers,
                                   prefetch_factor=factor, prefetch=ahead, spread=True)
            group_size = len(loader.sampler)
            ranks = featshard.distribute.cp_group(plan, mesh).ranks
            me = ranks.index(rank)
            most = 0
            for step, _ in enumerate(loader):
                # Samples this rank has made and not yet handed over, its own turns.
                handed = sum(1 for k in range(step + 1) if k % len(ranks) == me)
                most = max(most, fetched.value - handed)
            out["most_ahead"] = most
            out["bound"] = workers * factor + ahead + 1
            # Each of this rank's turns fetched once: nothing made twice or skipped.
            out["fetched"] = fetched.value
            out["turns"] = sum(1 for k in range(group_size) if k % len(ranks) == me)
        elif scenario == "presharded":
            from featshard.data import PreshardedDataset

            ds = PreshardedDataset(plan, Path(results).parent / "sharded", mesh)
            want = [ds[i] for i in dp_sampler(plan, ds, mesh, shuffle=True, seed=5)]
            # Each rank reads its own next files ahead, on the loader's thread.
            got = list(FeatureLoader(plan, ds, mesh, shuffle=True, seed=5, prefetch=2))
            _same_steps(got, want, f"rank {rank}")
            # And they are the samples the online path gives.
            online = list(FeatureLoader(plan, Serial(), mesh, shuffle=True, seed=5))
            _same_steps(got, online, f"rank {rank} against the online path")
        elif scenario == "seeds":
            # Each rank's sampler drawn by another seed: with spread turns each rank would
            # featurize its own permutation's sample, and the steps would mix them.
            from featshard.errors import FeatureDistributionError

            for options in ({"spread": True}, {"spread": True, "num_workers": 1, "prefetch": 1}):
                loader = FeatureLoader(plan, Serial(), mesh, shuffle=True, seed=rank, **options)  # type: ignore[arg-type]
                try:
                    steps = len(list(loader))
                    raise AssertionError(f"{options}: {steps} steps of mixed samples, no error")
                except FeatureDistributionError as e:
                    out.setdefault("errors", []).append(str(e))
                assert not _children(), f"{options}: worker processes left"
        elif scenario == "lightning_resume":
            whole = _fit(plan, mesh, 1)
            ckpt = Path(results) / f"rank-{rank}.ckpt"
            first = _fit(plan, mesh, 1, max_steps=2, save=ckpt)
            rest = _fit(plan, mesh, 1, resume=ckpt)
            out["seen"] = {"whole": whole, "first": first, "rest": rest}
            out["children"] = len(_children())
        elif scenario == "lightning":
            out["seen"] = {str(n): _fit(plan, mesh, n) for n in (0, 1)}
            out["children"] = len(_children())
        out["shm_left"] = sorted(_shm() - shm_before)
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test process
        out["status"] = f"{type(e).__name__}: {e}"
    Path(results, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def _fit(plan: Any, mesh: Any, workers: int, max_steps: int = -1, save: Path | None = None,
         resume: Path | None = None) -> list[float]:
    """A Lightning Trainer's two epochs over the data module with ``workers`` worker
    processes a rank (and, with workers, two steps ahead): what each training step saw
    (the sum of its batch's reference positions, over the whole mesh). Stopped after
    ``max_steps`` and its checkpoint saved to ``save``, or resumed from ``resume``."""
    import lightning.pytorch as pl
    import torch
    from featshard.lightning import lightning_datamodule
    from torch.distributed.tensor import DTensor

    seen: list[float] = []

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            pos = batch["ref_pos"]
            assert isinstance(pos, DTensor) and pos.device_mesh is mesh and pos.shape[0] == 2
            seen.append(float(pos.full_tensor().double().sum()))
            return (self.w * 0).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dm = lightning_datamodule(plan, mesh, train=Serial(), batch_size=1, seed=3, num_workers=workers,
                              prefetch=2 if workers else 0)
    class Stop(pl.Callback):
        """At the end of step ``max_steps``, the checkpoint saved and the fit stopped, as
        a job preempted mid-epoch leaves it."""

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if save is not None and trainer.global_step == max_steps:
                trainer.save_checkpoint(save)
                trainer.should_stop = True

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, callbacks=[Stop()],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(Model(), datamodule=dm, ckpt_path=resume)
    return seen


def _run(tmp_path: Path, shape: tuple[int, ...], one_axis: bool, batch: int | None, scenario: str) -> list[Any]:
    import math

    world = math.prod(shape)
    results = tmp_path / f"results-{scenario}"
    results.mkdir()
    start_ranks(_worker, (world, str(tmp_path / f"store-{scenario}"), shape, one_axis, batch, scenario,
                          str(results)), world)
    return [json.loads((results / f"rank-{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize(("shape", "one_axis", "batch"), MESHES, ids=["tile2x2", "cp3", "dp2xcp2"])
def test_workers_and_spread_sources_give_the_synchronous_loaders_steps(
    tmp_path: Path, shape: tuple[int, ...], one_axis: bool, batch: int | None
) -> None:
    for r in _run(tmp_path, shape, one_axis, batch, "parity"):
        assert r["status"] == "ok", r
        assert r["shm_left"] == [], r


@pytest.mark.parametrize(("shape", "one_axis", "batch"), MESHES, ids=["tile2x2", "cp3", "dp2xcp2"])
def test_a_loader_resumed_from_its_state_gives_the_rest_of_the_epoch(
    tmp_path: Path, shape: tuple[int, ...], one_axis: bool, batch: int | None
) -> None:
    """Interrupted at step 2 with workers and prefetch in flight, a new loader given the
    state yields exactly the steps an uninterrupted epoch yields after them: none
    repeated, none lost; a state of another seed is refused by name."""
    outs = _run(tmp_path, shape, one_axis, batch, "resume")
    assert [o["status"] for o in outs] == ["ok"] * len(outs), outs
    assert all("the state is of another order" in o["refused"] and "seed=7" in o["refused"] for o in outs), outs


def test_a_failure_in_one_worker_is_raised_on_every_rank_at_its_step(tmp_path: Path) -> None:
    # Sample 3 fails on the rank whose turn it is (spread over the 3 ranks of (cp,)).
    for r in _run(tmp_path, (3,), True, None, "failure"):
        assert r["status"] == "ok", r
        assert r["error"] == "sample 3: featurizer failed", r
        assert r["steps_before"] == 3, r
        assert r["children"] == 0 and r["shm_left"] == [], r


def test_a_rank_holds_at_most_the_prefetch_depth_ahead(tmp_path: Path) -> None:
    for r in _run(tmp_path, (2, 2), False, None, "bound"):
        assert r["status"] == "ok", r
        assert r["most_ahead"] <= r["bound"], r
        assert r["fetched"] == r["turns"] > 0, r


def test_the_lightning_datamodule_with_workers_drives_a_trainer_as_without(tmp_path: Path) -> None:
    # dp 2 x cp 2: two epochs (reshuffled by epoch), one sample per replica a step.
    for r in _run(tmp_path, (2, 2), True, 1, "lightning"):
        assert r["status"] == "ok", r
        assert len(r["seen"]["0"]) == 2 * 3, r
        assert r["seen"]["1"] == r["seen"]["0"], r
        assert r["children"] == 0 and r["shm_left"] == [], r


def test_a_lightning_fit_resumed_mid_epoch_sees_the_rest_of_the_uninterrupted_sequence(tmp_path: Path) -> None:
    # dp 2 x cp 2, workers and two steps ahead: stopped at step 2 of epoch 0 (of 3), its
    # checkpoint (which holds the loader's state) resumed by a new Trainer.
    for r in _run(tmp_path, (2, 2), True, 1, "lightning_resume"):
        assert r["status"] == "ok", r
        seen = r["seen"]
        assert len(seen["whole"]) == 2 * 3 and seen["first"] == seen["whole"][:2], r
        assert seen["rest"] == seen["whole"][2:], r
        assert r["children"] == 0, r


def test_a_presharded_dataset_read_ahead_gives_each_rank_its_files(tmp_path: Path) -> None:
    import subprocess

    from conftest import featshard_bin
    from safetensors.torch import save_file

    data = tmp_path / "samples"
    data.mkdir()
    serial = Serial()
    for i in range(SAMPLES):
        flat = {k: x for k, x in serial.flat.items()}
        flat["ref_pos"] = flat["ref_pos"] + i
        # Named so that the dataset's order is the index order.
        save_file(flat, str(data / f"s{i}.safetensors"))
    subprocess.run([str(featshard_bin()), "shard", str(SPEC), "--features", str(data), "--mesh", "2x2",
                    "--out", str(tmp_path / "sharded")], check=True, capture_output=True)
    for r in _run(tmp_path, (2, 2), False, None, "presharded"):
        assert r["status"] == "ok", r


def test_an_interrupted_loop_leaves_no_worker_or_shared_memory(tmp_path: Path) -> None:
    for r in _run(tmp_path, (3,), True, None, "interrupt"):
        assert r["status"] == "ok", r
        assert r["children"] == 0 and r["shm_left"] == [], r


def test_ranks_whose_samplers_differ_are_every_ranks_named_error(tmp_path: Path) -> None:
    """Ranks given different sampler seeds (before: with spread, samples 4, 1, 5, 2, 0, 5
    delivered, one twice and one never): at the first step every rank raises the same
    error, naming what differs on which ranks, synchronous or with workers ahead."""
    outs = _run(tmp_path, (3,), True, None, "seeds")
    for r in outs:
        assert r["status"] == "ok", r
        assert len(r["errors"]) == 2, r
        for e in r["errors"]:
            assert "ranks disagree on what decides the step's sample: rank 0 has `samples=5 shuffle=True seed=0" in e, e
            assert "rank 1 has `samples=5 shuffle=True seed=1" in e, e
    assert len({tuple(r["errors"]) for r in outs}) == 1, outs


class Stuck(Serial):
    """Sample 2's featurization never returns."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == 2:
            import time

            time.sleep(3600)
        return super().__getitem__(i)


def _wait_worker(rank: int, world: int, store: str, results: str, scenario: str) -> None:
    """A loader's waits, every one bounded by the loader's timeout: a worker that never
    returns, and ranks that leave their loop 0.3 s apart, then a second epoch."""
    sys.path[:0] = [str(HERE)]
    import time
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    import featshard
    from featshard.loader import FeatureLoader

    plan = featshard.Plan(SPEC)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=tuple(plan.mesh_axes))
    out: dict[str, Any] = {"rank": rank}
    # Short where the wait is the point; ample where no rank should wait at all (a
    # loaded machine featurizes slowly).
    timeout = timedelta(seconds=6 if scenario == "stuck" else 40)
    try:
        if scenario == "stuck":
            loader = FeatureLoader(plan, Stuck(), mesh, num_workers=1, spread=True, prefetch=1, timeout=timeout)
            start = time.monotonic()
            try:
                for _ in loader:
                    pass
                out["error"] = None
            except Exception as e:  # noqa: BLE001 - what each rank raised
                out["error"] = f"{type(e).__name__}: {e}"
            out["seconds"] = time.monotonic() - start
        else:
            loader = FeatureLoader(plan, Serial(), mesh, num_workers=1, spread=True, prefetch=1, timeout=timeout)
            it = iter(loader)
            for step, _ in enumerate(it):
                if step == 1:
                    # Rank 0 leaves a moment after the others (a slower last step).
                    if rank == 0:
                        time.sleep(0.3)
                    break
            start = time.monotonic()
            del it
            out["drop_seconds"] = time.monotonic() - start
            # The next epoch: every step, on the groups the first made.
            loader.set_epoch(1)
            out["next_epoch"] = sum(1 for _ in loader)
        out["children"] = len(_children())
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test process
        out["status"] = f"{type(e).__name__}: {e}"
    Path(results, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def _run_bounded(tmp_path: Path, scenario: str) -> list[dict[str, Any]]:
    from conftest import run_ranks

    results = tmp_path / scenario
    results.mkdir()
    codes = run_ranks(_wait_worker, (4, str(tmp_path / f"store-{scenario}"), str(results), scenario), 4,
                      deadline=120, daemon=False)
    assert codes == [0] * 4, f"exit codes (None: still waiting after 120 s): {codes}"
    return [json.loads((results / f"rank-{r}.json").read_text()) for r in range(4)]


def test_a_worker_that_never_returns_is_every_ranks_error_within_the_timeout(tmp_path: Path) -> None:
    """Before: the other ranks raised after the timeout and the source waited forever in
    its DataLoader."""
    outs = _run_bounded(tmp_path, "stuck")
    for r in outs:
        assert r["status"] == "ok", r
        assert r["error"] is not None and "DataLoader timed out" in r["error"], r
        assert r["children"] == 0, r
    assert len({r["error"] for r in outs}) == 1, outs


def test_ranks_that_leave_a_moment_apart_stop_cleanly_and_the_next_epoch_works(tmp_path: Path) -> None:
    """Before: the late rank's thread began the next step alone, waited out the whole
    timeout when its iterator was dropped, and the next epoch failed at step 0."""
    for r in _run_bounded(tmp_path, "apart"):
        assert r["status"] == "ok", r
        # No step was begun alone (whose wait would have broken the groups): the next
        # epoch takes every step on them.
        assert r["next_epoch"] == SAMPLES, r
        assert r["children"] == 0, r
