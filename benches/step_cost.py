"""Benchmark: one distribution step (`featshard.distribute.distribute_features`) on gloo
ranks in fresh processes, its median of five from a barrier to a barrier, for the
samples and meshes issue-sized regressions show on:

- `empty`: a spec of one feature over tokens and a sample of one token a rank: the
  step's fixed cost (its votes, messages and DTensors, nothing to place);
- `real`: the real Boltz-2 sample `prot60_smiles` (73 tokens, 481 atoms);
- `768`: a random Boltz-2-shaped sample of 768 tokens and 256 MSA rows.

Meshes: one CP axis of 8 ranks (the spec's `mesh:` line changed to `cp: [cp]`) and the
3x3 tile. It prints, per case, the median and the five times, and the metadata a step
moves: the vote's bytes and each receiver's header bytes. With `FEATSHARD_TREE_SITE`, a
folder holding another tree's installed package (`pip install --target`), that tree's
package is imported instead, so that two trees are timed in one sitting:

    . scripts/env.sh && cargo build --release
    python benches/step_cost.py                                   # this tree
    FEATSHARD_TREE_SITE=/tmp/site-2eb370b python benches/step_cost.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

if os.environ.get("FEATSHARD_TREE_SITE"):
    sys.path.insert(0, os.environ["FEATSHARD_TREE_SITE"])

from bench_common import ROOT, boltz_sample_file, load_resident
from torch.multiprocessing import spawn

REPEATS = 5
EMPTY_SPEC = """version: 1
module: empty
mesh: {cp: CP}
semantics: {tokens: {shard: true}}
features: {x: {axes: [tokens], dtype: float32}}
"""


def _worker(rank: int, world: int, folder: str, mesh_kind: str, case: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store-{mesh_kind}-{case}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    import featshard
    from featshard.distribute import cp_group, distribute_features

    one_axis = mesh_kind == "cp8"
    if one_axis:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    else:
        side = round(world ** 0.5)
        mesh = init_device_mesh("cpu", (side, side), mesh_dim_names=("cp_axis_0", "cp_axis_1"))
    spec = Path(folder) / f"{'empty' if case == 'empty' else 'boltz2'}-{mesh_kind}.yaml"
    plan = featshard.Plan(spec)
    workflow = None if case == "empty" else "inference"
    group = cp_group(plan, mesh)
    warm = {"x": torch.ones(world)} if case == "empty" else load_resident(
        ROOT / "tests" / "data" / "real" / "prot60_nomsa.safetensors")
    distribute_features(plan, warm if rank == 0 else None, mesh, workflow=workflow, group=group, threads=2)
    sample: Any = None
    if rank == 0:
        sample = {"empty": warm, "real": None, "768": None}[case]
        if case == "real":
            sample = load_resident(ROOT / "tests" / "data" / "real" / "prot60_smiles.safetensors")
        elif case == "768":
            sample = load_resident(Path(folder) / "sample.safetensors")
    seconds = []
    for _ in range(REPEATS):
        dist.barrier()
        start = time.perf_counter()
        distribute_features(plan, sample, mesh, workflow=workflow, group=group, threads=2)
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    if rank == 0:
        from featshard import blocks

        header = None
        if hasattr(blocks.Placement, "header"):
            placed = blocks.place(plan, sample, tuple(mesh.mesh.shape), workflow=workflow)
            header = len(placed.header(compact=True).to_bytes())
        Path(folder, f"{mesh_kind}-{case}.json").write_text(json.dumps({"s": seconds, "header": header}))
    dist.destroy_process_group()


def main() -> None:
    import featshard
    from featshard import _native

    with tempfile.TemporaryDirectory(prefix="featshard-step-") as folder:
        text = (ROOT / "examples" / "boltz2.yaml").read_text()
        Path(folder, "boltz2-cp8.yaml").write_text(text.replace("cp: [cp_axis_0, cp_axis_1]", "cp: [cp]"))
        Path(folder, "boltz2-tile3x3.yaml").write_text(text)
        Path(folder, "empty-cp8.yaml").write_text(EMPTY_SPEC.replace("CP", "[cp]"))
        Path(folder, "empty-tile3x3.yaml").write_text(EMPTY_SPEC.replace("CP", "[cp_axis_0, cp_axis_1]"))
        boltz_sample_file(Path(folder), 768, 256)
        vote = len(_native.vote(False, None)) * 8 if hasattr(_native, "vote") else None
        print(f"featshard from {Path(featshard.__file__).parent}; a vote: {vote} bytes a rank")
        for mesh_kind, world in (("cp8", 8), ("tile3x3", 9)):
            for case in ("empty", "real", "768"):
                spawn(_worker, args=(world, folder, mesh_kind, case), nprocs=world)
                got = json.loads(Path(folder, f"{mesh_kind}-{case}.json").read_text())
                times = ", ".join(f"{s * 1000:.1f}" for s in got["s"])
                header = f"; header {got['header']} B a receiver" if got["header"] is not None else ""
                print(f"{mesh_kind:8} {case:6} median {statistics.median(got['s']) * 1000:7.1f} ms"
                      f"  [{times}]{header}", flush=True)


if __name__ == "__main__":
    main()
