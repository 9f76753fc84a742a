"""Benchmark: reading pre-sharded samples back, compact rank files against dense ones.

    . scripts/env.sh && cargo build --release
    maturin build --release -m python/Cargo.toml -o target/wheels && pip install --force-reinstall target/wheels/featshard-*.whl
    python benches/presharded_read.py           # the files in the page cache
    python benches/presharded_read.py cold      # the page cache dropped before each sample
    python benches/presharded_read.py warm cuda # a CUDA mesh (rank r on GPU r mod their count)

Shards four copies of one Boltz-2-shaped sample (512 tokens, up to 11 atoms a token, 2048
MSA rows, the optional `pair_mask` included) on 3x3 with `featshard shard --encoding
compact` and `--encoding dense`, then 9 gloo ranks each read their own rank file of every
sample through `featshard.data.PreshardedDataset` (manifest and rank identity checked,
CRC-32 verified, compact blocks expanded, DTensors made): time per sample is the slowest
rank's, the median over the samples after the first. Both encodings in one run, dense
first then compact, then dense again. On a CUDA mesh every block ends on the rank's GPU
(compact blocks checked on the host and expanded there, dense blocks copied), and a
sample's time ends once the GPU is done with it.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from bench_common import ROOT, SPEC, boltz_sample_file
from torch.multiprocessing import spawn

# `cold`: the page cache is dropped before each sample (as when the files come from disk,
# not memory); needs permission to write /proc/sys/vm/drop_caches.
COLD = len(sys.argv) > 1 and sys.argv[1] == "cold"
# A second argument names the mesh's device (`cuda`); the CPU by default.
DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cpu"
MESH = (3, 3)
RANKS = MESH[0] * MESH[1]
SAMPLES = 4


def _worker(rank: int, folder: str, encoding: str, run: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store-{encoding}-{run}", rank=rank,
                            world_size=RANKS, timeout=timedelta(seconds=600))
    if DEVICE == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    mesh = init_device_mesh(DEVICE, MESH, mesh_dim_names=("cp_axis_0", "cp_axis_1"))
    import featshard
    from featshard.data import PreshardedDataset

    ds = PreshardedDataset(featshard.Plan(SPEC), Path(folder) / encoding, mesh)
    times = []
    for i in range(len(ds)):
        if COLD and rank == 0:
            drop_page_cache()
        dist.barrier()
        start = time.perf_counter()
        ds[i]
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    Path(folder, f"{encoding}-{run}-{rank}.json").write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


def drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="featshard-read-") as d:
        folder = Path(d)
        _, size = boltz_sample_file(folder, 512, 2048, (0, 12))
        data = folder / "data"
        data.mkdir()
        for i in range(SAMPLES):
            shutil.copy(folder / "sample.safetensors", data / f"s{i}.safetensors")
        written = {}
        for encoding in ("dense", "compact"):
            subprocess.run([str(ROOT / "target" / "release" / "featshard"), "shard", str(SPEC), "--features",
                            str(data), "--mesh", f"{MESH[0]}x{MESH[1]}", "--workflow", "inference",
                            "--encoding", encoding, "--out", str(folder / encoding)], check=True, capture_output=True)
            written[encoding] = sum(f.stat().st_size for f in (folder / encoding / "s0").glob("rank-*"))
        print(f"sample: 512 tokens, {size / 1e6:.0f} MB serial; mesh {MESH[0]}x{MESH[1]} on {DEVICE}, {RANKS} ranks; "
              f"rank files per sample: dense {written['dense'] / 1e6:.1f} MB, compact {written['compact'] / 1e6:.1f} MB")
        medians: dict[str, list[float]] = {"dense": [], "compact": []}
        for run, encoding in enumerate(("dense", "compact", "dense")):
            spawn(_worker, args=(str(folder), encoding, run), nprocs=RANKS, join=True)  # type: ignore[no-untyped-call]
            per_rank = [json.loads((folder / f"{encoding}-{run}-{r}.json").read_text()) for r in range(RANKS)]
            slowest = [max(t[i] for t in per_rank) for i in range(SAMPLES)]
            medians[encoding].append(statistics.median(slowest[1:]))
            print(f"run {run + 1}, {encoding}: per sample (slowest rank) "
                  + " ".join(f"{s * 1e3:.0f}" for s in slowest) + " ms")
        dense, compact = statistics.mean(medians["dense"]), medians["compact"][0]
        print(f"time per sample: dense {dense * 1e3:.0f} ms (mean of two runs), compact {compact * 1e3:.0f} ms; "
              f"compact / dense {compact / dense:.2f}")


if __name__ == "__main__":
    sys.exit(main())
