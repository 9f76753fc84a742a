"""Benchmark: what Lightning's `transfer_batch_to_device` (`featshard.data.to_device_mesh`)
costs on a CPU mesh, in one run: a collated batch of the real Boltz-2 sample (about 80
DTensors) on dp 2 x (1, 1) gloo ranks,

- `already there`: the batch on the model's mesh and device, as the data module's
  collate leaves it (kept as it is);
- `re-wrapped`: the same batch handed over with another mesh object of the same layout
  (every DTensor re-wrapped onto the model's mesh: what every batch cost before a batch
  already in place was kept);
- `single sample`: one distributed sample on a (cp0, cp1) mesh, which gains its batch
  axis of 1 (re-wrapped, as it must be);

and, for scale, distributing that sample (`distribute_features`).

    maturin build --release -m python/Cargo.toml -o target/wheels && pip install --force-reinstall target/wheels/featshard-*.whl
    python benches/transfer_batch.py

Each figure is the median of 20 calls on rank 0.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from datetime import timedelta
from typing import Any

from bench_common import ROOT, SPEC
from torch.multiprocessing import spawn

REPEATS = 20


def _median_ms(call: Any) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _worker(rank: int, folder: str) -> None:
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2,
                            timeout=timedelta(seconds=300))
    import featshard
    from featshard.data import collate, cpu_mesh_like, to_device_mesh
    from featshard.distribute import cp_group, distribute_features

    plan = featshard.Plan(SPEC)
    mesh = init_device_mesh("cpu", (2, 1, 1), mesh_dim_names=("dp", "cp_axis_0", "cp_axis_1"))
    sample = load_file(str(ROOT / "tests" / "data" / "real" / "prot60_smiles.safetensors"))
    group = cp_group(plan, mesh)
    got = distribute_features(plan, sample, mesh, workflow="inference", group=group)
    batch = collate(plan, [got], mesh)
    other = cpu_mesh_like(mesh)
    elsewhere = {n: (torch.distributed.tensor.DTensor.from_local(x.to_local(), other, x.placements, run_check=False,
                                                                  shape=x.shape, stride=x.stride())
                     if hasattr(x, "to_local") else x) for n, x in batch.items()}
    cp_mesh = mesh["cp_axis_0", "cp_axis_1"]
    device = torch.device("cpu")
    dtensors = sum(1 for x in batch.values() if hasattr(x, "to_local"))
    figures = {
        "already there": _median_ms(lambda: to_device_mesh(plan, batch, mesh, device)),
        "re-wrapped": _median_ms(lambda: to_device_mesh(plan, elsewhere, mesh, device)),
        "single sample": _median_ms(lambda: to_device_mesh(plan, got, cp_mesh, device)),
        "distribute_features": _median_ms(
            lambda: distribute_features(plan, sample, mesh, workflow="inference", group=group)),
    }
    if rank == 0:
        print(f"{dtensors} DTensors; median of {REPEATS} calls on rank 0\n")
        print("| transfer_batch_to_device of | time | / distributing the sample |")
        print("|---|---|---|")
        for label, ms in figures.items():
            print(f"| {label} | {ms:.2f} ms | {ms / figures['distribute_features']:.3f} |")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="featshard-transfer-bench-") as folder:
        spawn(_worker, args=(folder,), nprocs=2, join=True)  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
