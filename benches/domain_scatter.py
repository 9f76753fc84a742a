"""Benchmark: peak memory per rank of the two domain-parallel scatters of the generated
volume module, on one large field sample (a 3000 x 3000 grid: velocity, pressure and
the fluid mask, 153 MB), over 4 gloo CPU ranks on its 2D domain mesh (2 x 2: x in
torch.chunk pieces, y padded to even shards).

- `scatter`: the source rank loads the sample file and scatters it (PhysicsNeMo's
  `scatter_tensor`: a broadcast of every whole tensor, then each rank keeps its part);
- `scatter_local`: every rank reads only its own part of the same file
  (`safetensors_source`) and builds its ShardTensors with `from_local`.

Each rank measures its own peak RSS above what it held before the scatter (the kernel's
peak counter reset through `/proc/self/clear_refs`), fresh processes per path, and the
wall time of the scatter on the slowest rank.

    . scripts/env.sh && cargo build --release
    ~/.cache/featshard/venv/bin/python benches/domain_scatter.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from bench_common import status
from torch.multiprocessing.spawn import spawn

ROOT = Path(__file__).resolve().parents[1]
DOMAIN = (2, 2)
RANKS = 4
XS = YS = 3000


def _worker(rank: int, folder: str, path: str, how: str) -> None:
    sys.path.insert(0, folder)
    torch.set_num_threads(1)
    import volume_placements as P

    mesh = P.setup(DOMAIN, 1, init_method=f"file://{folder}/store-{how}", rank=rank, world_size=RANKS,
                   timeout=timedelta(seconds=300))
    dmesh = P.domain_mesh(mesh)
    torch.distributed.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    before = status("VmRSS")
    start = time.perf_counter()
    if how == "scatter":
        from safetensors.torch import load_file

        sample: dict[str, Any] | None = None
        if rank == int(dmesh.mesh.flatten()[0]):
            sample = dict(load_file(path))
        out = P.scatter(sample, mesh).inputs
    else:
        read, lengths = P.safetensors_source(path)
        out = P.scatter_local(read, lengths, mesh).inputs
    torch.distributed.barrier()
    seconds = time.perf_counter() - start
    block = sum(out[n].to_local().numel() * out[n].to_local().element_size() for n in P.FEATURES)
    peak = status("VmHWM") - before
    Path(folder, f"{how}-{rank}.json").write_text(json.dumps({"peak": peak, "block": block, "s": seconds}))
    del out
    # PhysicsNeMo's manager (which the scatter adopts the group into) destroys it, once:
    # its exit hook would destroy it again after a direct call, and fail.
    from physicsnemo.distributed import DistributedManager

    DistributedManager.cleanup()


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="featshard-domain-bench-"))
    try:
        subprocess.run([str(ROOT / "target" / "release" / "featshard"), "generate",
                        str(ROOT / "examples" / "volume.yaml"), "--out", str(folder)], check=True,
                       capture_output=True)
        from safetensors.torch import save_file

        g = torch.Generator().manual_seed(0)
        sample = {
            "velocity": torch.randn(1, XS, YS, 3, generator=g),
            "pressure": torch.randn(1, XS, YS, generator=g),
            "fluid_mask": torch.rand(XS, YS, generator=g) > 0.1,
            "reynolds": torch.tensor([100.0]),
        }
        size = sum(t.numel() * t.element_size() for t in sample.values())
        path = folder / "sample.safetensors"
        save_file(sample, str(path))
        del sample
        print(f"sample: {size / 1e6:.0f} MB ({XS} x {YS}), domain mesh {DOMAIN}")
        print("| path | rank | its blocks | peak RSS above start | / its blocks | / sample | wall (slowest) |")
        print("|---|---|---|---|---|---|---|")
        for how in ("scatter", "scatter_local"):
            spawn(_worker, args=(str(folder), str(path), how), nprocs=RANKS, join=True)  # type: ignore[no-untyped-call]
            rows = [json.loads((folder / f"{how}-{r}.json").read_text()) for r in range(RANKS)]
            wall = max(r["s"] for r in rows)
            for r, row in enumerate(rows):
                print(f"| `{how}` | {r} | {row['block'] / 1e6:.0f} MB | {row['peak'] / 1e6:.0f} MB | "
                      f"{row['peak'] / row['block']:.2f} | {row['peak'] / size:.2f} | {wall:.2f} s |")

    finally:
        shutil.rmtree(folder, ignore_errors=True)

if __name__ == "__main__":
    main()
