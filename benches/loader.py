"""Benchmark: the data stall of a training loop under context parallelism, for the
loaders featshard offers, in one run.

Gloo ranks in fresh processes run a training loop: a sample costs `C` to featurize
(a sleep in the serial dataset's `__getitem__`, standing for a node's own cores) and a
model step costs `M` (a sleep, standing for the GPU). The stall of a step is the time
from the end of one model step to the next batch in hand; each step's stall is the
slowest rank's (an all-reduce of max over a group of the benchmark's own, after the
loop). Loaders, each over the same samples:

- `distribution alone`: the synchronous loader with `C = 0` (what moving a sample costs);
- `synchronous`: `DataLoader(DistributedFeatureDataset, num_workers=0)`: the group's
  source featurizes on the step while the group waits;
- `workers on the source`: `FeatureLoader(num_workers=W, spread=False)`;
- `sources spread`: `FeatureLoader(num_workers=W, spread=True)`: the group's ranks
  featurize in turn;
- `spread + prefetch`: the same, one step distributed ahead by a thread (`prefetch=1`).

Samples: the real Boltz-2 sample `tests/data/real/prot60_smiles.safetensors`, and a
synthetic 768-token Boltz-2-shaped one (1,024 MSA rows). Each rank's peak resident set
above its start is reported beside (the bound the loader's depth sets).

    . scripts/env.sh && cargo build --release
    maturin build --release -m python/Cargo.toml -o target/wheels && pip install --force-reinstall target/wheels/featshard-*.whl
    python benches/loader.py [RANKS] [C_OVER_M] [M_SECONDS] [STEPS]

Defaults: 4 ranks (a 2x2 tile), `C = 4 M` (= P x M, the goal's edge), `M = 0.25 s`, 16
steps after one warm-up step. Memory, the largest rank's: its peak resident set above
its start, and what its worker processes hold of their own at the end (private pages:
the samples they read, the buffers not yet handed over), which the loader's depth
bounds.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench_common import ROOT, SPEC, boltz_sample_file, reset_peak, status
from torch.multiprocessing import spawn
from torch.utils.data import Dataset

RANKS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
C_OVER_M = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
M = float(sys.argv[3]) if len(sys.argv) > 3 else 0.25
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else 16
WORKERS = 2
LOADERS = ("distribution alone", "synchronous", "workers on the source", "sources spread",
           "spread + prefetch")


class Serial(Dataset[dict[str, Any]]):
    """`STEPS + 1` samples, each the one file's sample after `cost` seconds of
    featurizing. Loaded lazily, so a worker process opens the file itself."""

    def __init__(self, path: str, cost: float) -> None:
        self.path, self.cost = path, cost
        self.sample: dict[str, Any] | None = None

    def __len__(self) -> int:
        return STEPS + 1

    def __getitem__(self, i: int) -> dict[str, Any]:
        from safetensors.torch import load_file

        if self.sample is None:
            self.sample = load_file(self.path)
        time.sleep(self.cost)
        return self.sample

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "cost": self.cost, "sample": None}


def _private_of(pid: int) -> int:
    """A process's private memory (pages no other process shares: what a forked worker
    added to its rank), in bytes (0 once it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return 0
    return sum(int(line.split()[1]) * 1024 for line in lines
               if line.startswith(("Private_Clean:", "Private_Dirty:")))


def _mesh_shape() -> tuple[int, int]:
    side = int(RANKS ** 0.5)
    return (side, RANKS // side) if side * side == RANKS else (RANKS, 1)


def _worker(rank: int, folder: str, sample: str, how: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store-{how.replace(' ', '-')}",
                            rank=rank, world_size=RANKS, timeout=timedelta(seconds=600))
    mesh = init_device_mesh("cpu", _mesh_shape(), mesh_dim_names=("cp_axis_0", "cp_axis_1"))
    import featshard
    from featshard.data import DistributedFeatureDataset, dp_sampler
    from featshard.loader import FeatureLoader

    plan = featshard.Plan(SPEC)
    cost = 0.0 if how == "distribution alone" else C_OVER_M * M
    serial = Serial(sample, cost)
    loader: Any
    if how in ("distribution alone", "synchronous"):
        dataset = DistributedFeatureDataset(plan, serial, mesh, workflow="inference")
        loader = DataLoader(dataset, batch_size=None, sampler=dp_sampler(plan, dataset, mesh, shuffle=False),
                            num_workers=0)
    else:
        loader = FeatureLoader(plan, serial, mesh, workflow="inference", num_workers=WORKERS,
                               spread=how != "workers on the source",
                               prefetch=1 if how == "spread + prefetch" else 0)
    stalls: list[float] = []
    before = reset_peak()
    batches = iter(loader)
    next(batches)  # warm-up: the first sample costs what no later one does
    end = time.perf_counter()
    for _ in range(STEPS):
        next(batches)
        ready = time.perf_counter()
        stalls.append(ready - end)
        time.sleep(M)  # the model's step
        end = time.perf_counter()
    # What the rank's worker processes hold of their own (read before they end with
    # the iterator): the sample they read, the buffers they wrote and not yet handed
    # over, their own objects; the pages forked from the rank are not theirs.
    workers = sum(_private_of(p.pid) for p in multiprocessing.active_children() if p.pid is not None)
    del batches
    peak = status("VmHWM") - before
    # The slowest rank's stall of each step, on a group of the benchmark's own.
    mine = torch.tensor(stalls, dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    worst = torch.tensor([float(peak), float(workers)], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if rank == 0:
        Path(folder, f"{how}.json").write_text(json.dumps(
            {"stalls": mine.tolist(), "peak": worst[0].item(), "workers": worst[1].item()}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="featshard-loader-bench-") as folder:
        synthetic = Path(folder) / "synthetic"
        synthetic.mkdir()
        atoms, size = boltz_sample_file(synthetic, 768, 1024, (0, 20), pair_mask=False)
        samples = [
            ("real Boltz-2 (prot60_smiles)", ROOT / "tests" / "data" / "real" / "prot60_smiles.safetensors"),
            (f"synthetic 768 tokens, {atoms} atoms, {size / 1e6:.0f} MB", synthetic / "sample.safetensors"),
        ]
        print(f"mesh {_mesh_shape()} on {RANKS} gloo ranks; M = {M:.2f} s, C = {C_OVER_M:g} M ="
              f" {C_OVER_M * M:.2f} s; {WORKERS} workers a rank where workers run; {STEPS} steps")
        for label, path in samples:
            print(f"\n{label}\n")
            print("| loader | stall per step, median | max | / distribution alone | rank's peak RSS above start | its workers' own memory |")
            print("|---|---|---|---|---|---|")
            alone = None
            for how in LOADERS:
                spawn(_worker, args=(folder, str(path), how), nprocs=RANKS, join=True)  # type: ignore[no-untyped-call]
                row = json.loads(Path(folder, f"{how}.json").read_text())
                median = statistics.median(row["stalls"])
                alone = median if alone is None else alone
                print(f"| {how} | {median * 1e3:.0f} ms | {max(row['stalls']) * 1e3:.0f} ms |"
                      f" {median / alone:.2f} | {row['peak'] / 1e6:.0f} MB | {row['workers'] / 1e6:.0f} MB |")


if __name__ == "__main__":
    main()
