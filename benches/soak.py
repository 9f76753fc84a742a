"""Soak: many small samples through the two ways a rank gets its DTensors, on 4 gloo
ranks (a 2x2 CP mesh), each rank watching its own resident memory, open file
descriptors and throughput for a leak.

    . scripts/env.sh && cargo build --release
    maturin build --release -m python/Cargo.toml -o target/wheels
    pip install --force-reinstall target/wheels/featshard-*.whl
    python benches/soak.py            # 2,000 samples each way
    python benches/soak.py 200        # a shorter run

The sample is the real `prot60_nomsa` (73 tokens, featurized by Boltz-2). First, the
samples are pre-sharded by `featshard shard` over a folder of that many hard links to
it (compact rank files) and read by every rank through the Lightning data module
(`lightning_datamodule(..., predict=PreshardedDataset(...))`, its predict loader); then
as many go through `distribute_features` from the CP group's source. Each rank records,
every `WINDOW` samples, its resident set (VmRSS), its open file descriptors and the
window's samples per second; the first `WARM` samples are warm-up. Printed: per phase
and rank, the growth of both after warm-up (and of the resident set in the second half
alone: a leak grows as much there as in the first) and the spread of the windows'
throughput.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench_common import ROOT, SPEC, status
from torch.multiprocessing import spawn

SAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
MESH = (2, 2)
RANKS = MESH[0] * MESH[1]
WINDOW = max(SAMPLES // 20, 10)
WARM = 2 * WINDOW
REAL = ROOT / "tests" / "data" / "real" / "prot60_nomsa.safetensors"


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _watch(items: Any, out: list[dict[str, float]]) -> None:
    """Consumes ``items``, recording every ``WINDOW`` samples the resident set, the
    open file descriptors and the window's throughput."""
    start = time.perf_counter()
    for k, _ in enumerate(items, 1):
        if k % WINDOW == 0:
            now = time.perf_counter()
            out.append({"samples": k, "rss": status("VmRSS"), "fds": _fds(), "per_s": WINDOW / (now - start)})
            start = now


def _worker(rank: int, folder: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=RANKS, timeout=timedelta(seconds=600))
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("cp_axis_0", "cp_axis_1"))
    import featshard
    from featshard.data import PreshardedDataset
    from featshard.distribute import cp_group, distribute_features
    from featshard.lightning import lightning_datamodule
    from safetensors.torch import load_file

    plan = featshard.Plan(SPEC)
    records: dict[str, list[dict[str, float]]] = {"presharded": [], "distribute": []}
    ds = PreshardedDataset(plan, Path(folder) / "sharded", mesh)
    dm = lightning_datamodule(plan, mesh, predict=ds, workflow="inference")
    _watch(dm.predict_dataloader(), records["presharded"])
    group = cp_group(plan, mesh)
    sample = load_file(str(REAL)) if rank == 0 else None
    steps = (distribute_features(plan, sample, mesh, workflow="inference", group=group) for _ in range(SAMPLES))
    _watch(steps, records["distribute"])
    Path(folder, f"rank-{rank}.json").write_text(json.dumps(records))
    dist.barrier()
    dist.destroy_process_group()


def _summary(phase: str, rank: int, rows: list[dict[str, float]]) -> str:
    warm = [r for r in rows if r["samples"] > WARM]
    first, middle, last = warm[0], warm[len(warm) // 2], warm[-1]
    rates = [r["per_s"] for r in warm]
    return (f"| {phase} | {rank} | {first['rss'] / 1e6:.1f} | {(last['rss'] - first['rss']) / 1e6:+.1f} "
            f"| {(last['rss'] - middle['rss']) / 1e6:+.1f} "
            f"| {first['fds']:.0f} | {last['fds'] - first['fds']:+.0f} | {statistics.median(rates):.0f} "
            f"| {min(rates):.0f}-{max(rates):.0f} |")


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "data"
        data.mkdir()
        for k in range(SAMPLES):
            os.link(REAL, data / f"s{k:05d}.safetensors")
        featshard_bin = ROOT / "target" / "release" / "featshard"
        start = time.perf_counter()
        subprocess.run([str(featshard_bin), "shard", str(SPEC), "--features", str(data), "--mesh",
                        f"{MESH[0]}x{MESH[1]}", "--workflow", "inference", "--jobs", "2",
                        "--out", str(Path(folder) / "sharded")], check=True, stdout=subprocess.DEVNULL)
        print(f"{SAMPLES} samples of {REAL.name} sharded on {MESH[0]}x{MESH[1]} (compact) in "
              f"{time.perf_counter() - start:.0f} s; windows of {WINDOW} samples, the first {WARM} warm-up")
        start = time.perf_counter()
        spawn(_worker, args=(folder,), nprocs=RANKS, join=True)
        print(f"{RANKS} ranks, both phases: {time.perf_counter() - start:.0f} s")
        print("| phase | rank | RSS after warm-up (MB) | RSS growth (MB) | of it, in the second half | fds after "
              "warm-up | fd growth | samples/s (median) | samples/s (range) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for rank in range(RANKS):
            records = json.loads(Path(folder, f"rank-{rank}.json").read_text())
            for phase in ("presharded", "distribute"):
                print(_summary(phase, rank, records[phase]))


if __name__ == "__main__":
    main()
