"""Benchmark: one Boltz-2-shaped sample (1024 tokens, 2048 MSA rows, as the featurizer
emits it: no `pair_mask`) distributed over a one-axis CP mesh `(cp,)` of 8 gloo ranks in
fresh processes, three ways in one run:

- `featshard dense`: `featshard.distribute.distribute_features` on the spec with its
  `mesh:` line changed to `cp: [cp]`, from the dense sample (blocks travel compact);
- `featshard compact`: the same from the sample with its one-hot features as indices,
  its sparse features as their nonzero elements and its ranged integers narrowed;
- `featshard COO`: the same, its sparse features as `torch.sparse_coo_tensor`s;
- `boltz-cp`: Boltz-CP's own `distribute_features` (`boltz.distributed.data.utils`,
  imported from a Boltz-CP checkout: every rank allocates each full tensor and
  `distribute_tensor` scatters it) with the same 1-D placements, on the sample already
  padded as its 1-D data modules pad it (featshard's padded layout, made before the clock
  starts: Boltz-CP's padding is not timed).

    . scripts/env.sh && cargo build --release
    maturin build --release -m python/Cargo.toml -o target/wheels && pip install --force-reinstall target/wheels/featshard-*.whl
    pip install --target /tmp/bcp-deps mashumaro rdkit scipy    # what Boltz-CP's module imports
    BOLTZ_CP_SRC=/path/to/boltz-cp/src BOLTZ_CP_DEPS=/tmp/bcp-deps python benches/one_axis.py [TOKENS] [RANKS]

Each rank distributes one small real sample first (what a first call costs once), resets
its peak resident set with the sample loaded, then reports its peak above that and the
median time of five samples in a row (from a barrier to a barrier). Without
`BOLTZ_CP_SRC` the Boltz-CP path is left out and said so.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench_common import (
    ROOT,
    SPEC,
    as_coo,
    boltz_sample_file,
    load_resident,
    reset_peak,
    status,
)
from torch.multiprocessing import spawn

TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
RANKS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
REPEATS = 5
PATHS = ("featshard dense", "featshard compact", "featshard COO", "boltz-cp")


def _worker(rank: int, folder: str, how: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store-{how.replace(' ', '-')}",
                            rank=rank, world_size=RANKS, timeout=timedelta(seconds=900))
    mesh = init_device_mesh("cpu", (RANKS,), mesh_dim_names=("cp",))
    run = _runner(how, folder, mesh, rank)
    from safetensors.torch import load_file

    small = load_file(str(ROOT / "tests" / "data" / "real" / "prot60_nomsa.safetensors"))
    run(small if rank == 0 else None, warm=True)
    sample = _sample(how, folder) if rank == 0 else None
    gc.collect()
    dist.barrier()
    before = reset_peak()
    seconds, out = [], {}
    for _ in range(REPEATS):
        out = {}
        gc.collect()
        dist.barrier()
        start = time.perf_counter()
        out = run(sample, warm=False)
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    peak = status("VmHWM") - before
    dtensors = {n: x.to_local() for n, x in out.items() if hasattr(x, "to_local")}
    blocks = sum(x.numel() * x.element_size() for x in dtensors.values())
    # What each rank holds, to check the paths agree: every block's sum and shape.
    held = {n: [float(x.double().sum()), list(x.shape)] for n, x in dtensors.items()}
    Path(folder, f"{how}-{rank}.json").write_text(json.dumps(
        {"peak": peak, "block": blocks, "s": seconds, "held": held}))
    del out
    dist.barrier()
    dist.destroy_process_group()


def _sample(how: str, folder: str) -> dict[str, Any]:
    name = {"featshard dense": "sample", "featshard compact": "sample-indices", "featshard COO": "sample-indices",
            "boltz-cp": "sample-padded"}[how]
    sample = load_resident(Path(folder) / f"{name}.safetensors")
    if how == "featshard COO":
        return as_coo(sample, Path(folder) / "sample.safetensors")
    return sample


def _runner(how: str, folder: str, mesh: Any, rank: int) -> Any:
    """`run(sample, warm)`: one sample distributed the way `how` says."""
    import featshard
    from featshard.distribute import cp_group, distribute_features, placements

    plan = featshard.Plan(Path(folder) / "boltz2_1d.yaml")
    if how != "boltz-cp":
        group = cp_group(plan, mesh)

        def ours(sample: Any, warm: bool) -> dict[str, Any]:
            return distribute_features(plan, sample, mesh, workflow="inference", group=group,
                                       threads=2)
        return ours
    sys.path[:0] = [os.environ["BOLTZ_CP_SRC"], os.environ.get("BOLTZ_CP_DEPS", "")]
    import torch.distributed as dist
    from boltz.distributed.data.utils import distribute_features as theirs

    where = placements(plan)
    pg = cp_group(plan, mesh)[0]

    def boltz_cp(sample: Any, warm: bool) -> dict[str, Any]:
        if warm:
            # Padded as its 1-D data module pads (featshard's padded layout equals it).
            from featshard.blocks import place

            sample = place(plan, sample, (RANKS,), workflow="inference").padded() if rank == 0 else None
        present = [sorted(sample) if sample is not None else None]
        dist.broadcast_object_list(present, src=0, group=pg)
        return theirs(sample, {n: where[n] for n in present[0]}, pg, 0, mesh)  # type: ignore[union-attr]
    return boltz_cp


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="featshard-1d-bench-") as folder:
        bench(Path(folder))


def bench(folder: Path) -> None:
    (folder / "boltz2_1d.yaml").write_text(SPEC.read_text().replace("cp: [cp_axis_0, cp_axis_1]", "cp: [cp]"))
    atoms, size = boltz_sample_file(folder, TOKENS, 2048, (0, 20), pair_mask=False)
    import featshard
    from boltz_samples import as_elements, as_indices, as_narrow
    from featshard.blocks import place
    from safetensors.torch import load_file, save_file

    dense = load_file(str(folder / "sample.safetensors"))
    save_file(as_narrow(as_elements(as_indices(dense), pairs=True)), str(folder / "sample-indices.safetensors"))
    plan = featshard.Plan(folder / "boltz2_1d.yaml")
    padded = place(plan, dense, (RANKS,), workflow="inference").padded()
    save_file({n: x.contiguous() for n, x in padded.items()}, str(folder / "sample-padded.safetensors"))
    paths = PATHS if os.environ.get("BOLTZ_CP_SRC") else PATHS[:3]
    print(f"sample: {TOKENS} tokens, {atoms} atoms, 2048 MSA rows, {size / 1e6:.0f} MB serial"
          f" ({sum(x.numel() * x.element_size() for x in padded.values()) / 1e6:.0f} MB padded);"
          f" mesh (cp,) = ({RANKS}), {RANKS} gloo ranks; peak RSS above each rank's start")
    if len(paths) < len(PATHS):
        print("boltz-cp: left out (set BOLTZ_CP_SRC to a Boltz-CP checkout's src/)")
    print(f"| path | rank | its blocks | peak above start | / its blocks | time per sample (median of {REPEATS}) |")
    print("|---|---|---|---|---|---|")
    walls = {}
    for how in paths:
        spawn(_worker, args=(str(folder), how), nprocs=RANKS, join=True)  # type: ignore[no-untyped-call]
        rows = [json.loads((folder / f"{how}-{r}.json").read_text()) for r in range(RANKS)]
        walls[how] = statistics.median(max(r["s"][i] for r in rows) for i in range(REPEATS))
        largest = max(rows[1:], key=lambda r: r["peak"])
        for label, row in (("0 (source)", rows[0]), (f"1-{RANKS - 1} (largest)", largest)):
            print(f"| {how} | {label} | {row['block'] / 1e6:.1f} MB | {row['peak'] / 1e6:.1f} MB | "
                  f"{row['peak'] / max(row['block'], 1):.2f} | {walls[how]:.2f} s |")
    held = {how: [json.loads((folder / f"{how}-{r}.json").read_text())["held"] for r in range(RANKS)]
            for how in paths}
    for how in paths[1:]:
        # Boltz-CP receives every feature of the padded sample; compare the ones both hold.
        differ = sorted({n for a, b in zip(held[paths[0]], held[how]) for n in a.keys() & b.keys()
                         if a[n] != b[n]})
        print(f"{how}: every rank's blocks {'equal' if not differ else 'differ from'} {paths[0]}'s"
              + (f": {differ}" if differ else ""))
    if "boltz-cp" in walls:
        for how in PATHS[:3]:
            print(f"{how}: {walls['boltz-cp'] / walls[how]:.2f}x faster than boltz-cp")


if __name__ == "__main__":
    main()
