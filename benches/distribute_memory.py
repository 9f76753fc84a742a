"""Benchmark: peak memory and time of every rank while one Boltz-2-shaped sample (1024
tokens, 2048 MSA rows) is distributed over a 3x3 CP mesh of 9 gloo ranks, in fresh
processes, by the package (`featshard.distribute`, which the generated
`<module>_data.py` calls: the source sends each rank its blocks in one buffer, one rank
at a time), with one-hot features and maps sent dense and sent compact (as indices,
expanded on the receiving rank), and compact from a sample whose one-hot features
arrive as indices (as a featurizer that skips its final one-hot call writes it) and
whose sparse features arrive as their nonzero elements (`indices`: as a safetensors file
holds them; `coo`: as `torch.sparse_coo_tensor`s, as a featurizer hands them over in
memory), in the same run.

    . scripts/env.sh && cargo build --release
    maturin build --release -m python/Cargo.toml -o target/wheels && pip install --force-reinstall target/wheels/featshard-*.whl
    python benches/distribute_memory.py            # 1024 tokens, up to 19 atoms a token
    python benches/distribute_memory.py 768 12     # 768 tokens, up to 11 atoms a token
    python benches/distribute_memory.py 1024 20 boltz2   # without the optional pair_mask
    python benches/distribute_memory.py 1024 20 boltz2 1x2   # 2 ranks: a core each here
    python benches/distribute_memory.py 1024 20 boltz2 3x3 cuda   # a CUDA mesh (rank r on GPU r mod their count)

Each rank distributes one small sample first (what a first call costs once: lazy imports,
DTensor's first use, gloo's buffers), resets its peak resident set with the sample
loaded (the source's copied out of the file's map, so that it is resident), then
reports its peak above that, and the median time of five samples distributed in a row.
Each rank also reports its CPU seconds per sample (user and system, all its threads):
nine ranks share this machine's cores, so the wall time mixes their work; where every
rank has cores of its own, the source's work is what the last rank waits for.

On a CUDA mesh (fifth argument `cuda`; gloo carries the blocks, as it does on any mesh,
and rank r is on GPU r mod the machine's GPU count: all on one where there is one) each
rank's blocks end on its GPU: the peaks are host memory, which then holds none of them,
and each sample's time ends once the GPU has finished with it.
"""

from __future__ import annotations

import gc
import importlib
import json
import resource
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
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

# A fourth argument names another mesh (`1x2`); 3x3 by default.
MESH = tuple(int(n) for n in sys.argv[4].split("x")) if len(sys.argv) > 4 else (3, 3)
REPEATS = 5
# The source's threads for validation and writing buffers (the receivers wait meanwhile).
THREADS = 2
RANKS = MESH[0] * MESH[1]
# A fifth argument names the mesh's device (`cuda`); the CPU by default.
DEVICE = sys.argv[5] if len(sys.argv) > 5 else "cpu"


def _sync() -> None:
    """Waits for the GPU's queued work: a sample's time ends when its blocks are made."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _worker(rank: int, folder: str, how: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    sys.path[:0] = [folder, str(ROOT / "tests" / "python")]
    dist.init_process_group("gloo", init_method=f"file://{folder}/store-{how}", rank=rank,
                            world_size=RANKS, timeout=timedelta(seconds=600))
    if DEVICE == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    mesh = init_device_mesh(DEVICE, MESH, mesh_dim_names=("cp_axis_0", "cp_axis_1"))
    sample = None
    if rank == 0:
        name = "sample-indices" if how in ("indices", "coo") else "sample"
        sample = load_resident(Path(folder) / f"{name}.safetensors")
        if how == "coo":
            sample = as_coo(sample, Path(folder) / "sample.safetensors")
    import featshard
    from featshard.distribute import cp_group, distribute_features

    plan = featshard.Plan(SPEC)
    group = cp_group(plan, mesh)

    def run(x: object) -> dict[str, object]:
        return distribute_features(plan, x, mesh, workflow="inference", group=group,
                                   compact=how != "dense", threads=THREADS)
    # One small sample first: what the first call costs once (lazy imports, DTensor's
    # first use, gloo's buffers) is not what a sample costs.
    from boltz_samples import random_sample

    small = random_sample(importlib.import_module("boltz2_placements"), 8, seed=0)
    run(small if rank == 0 else None)
    gc.collect()
    dist.barrier()
    before = reset_peak()
    # Several samples in a row, each timed from a barrier to a barrier: the time per
    # sample a training loop sees (a first sample's fresh memory is slow on some
    # machines); one sample's blocks are held at a time.
    seconds, cpu, out = [], [], {}
    for _ in range(REPEATS):
        out = {}
        gc.collect()
        dist.barrier()
        start, used = time.perf_counter(), _cpu()
        out = run(sample)
        _sync()
        cpu.append(_cpu() - used)
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    blocks = sum(x.to_local().numel() * x.to_local().element_size()
                 for x in out.values() if hasattr(x, "to_local"))
    peak = status("VmHWM") - before
    floor = _floor(out, mesh) if how == "dense" else []
    sent = 0
    if rank == 0:
        from featshard.blocks import place

        placed = place(plan, sample, MESH, workflow="inference")
        sent = placed.buffer_offsets(compact=how != "dense")[1] * RANKS
    Path(folder, f"{how}-{rank}.json").write_text(json.dumps({"peak": peak, "block": blocks,
                                                              "s": seconds, "cpu": cpu, "sent": sent,
                                                              "floor": floor}))
    del out
    dist.barrier()
    dist.destroy_process_group()


def _cpu() -> float:
    """This process's CPU seconds so far, user and system, all its threads."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def _floor(out: dict[str, object], mesh: object) -> list[float]:
    """The least any path does, timed as a sample is: every rank writes its dense blocks
    (in place, into memory already mapped) and wraps them as DTensors; nothing is sent."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    dtensors = {n: x for n, x in out.items() if isinstance(x, DTensor)}
    seconds = []
    for _ in range(REPEATS):
        dist.barrier()
        start = time.perf_counter()
        for x in dtensors.values():
            local = x.to_local()
            local.zero_()
            DTensor.from_local(local, mesh, x.placements, run_check=False,  # type: ignore[arg-type]
                               shape=x.shape, stride=x.stride())
        _sync()
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="featshard-dist-bench-") as folder:
        bench(Path(folder))


def bench(folder: Path) -> None:
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    most = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    # `boltz2`: as the Boltz-2 featurizer emits a sample, without the optional pair_mask.
    with_pair_mask = not (len(sys.argv) > 3 and sys.argv[3] == "boltz2")
    atoms, size = boltz_sample_file(folder, tokens, 2048, (0, most), with_pair_mask)
    from boltz_samples import as_elements, as_indices, as_narrow
    from safetensors.torch import load_file, save_file

    compact_input = as_narrow(as_elements(as_indices(load_file(str(folder / "sample.safetensors"))), pairs=True))
    save_file(compact_input, str(folder / "sample-indices.safetensors"))
    given = (folder / "sample-indices.safetensors").stat().st_size
    what = "the optional pair_mask included" if with_pair_mask else "no pair_mask"
    print(f"sample: {tokens} tokens, {atoms} atoms ({what}), 2048 MSA rows, "
          f"{size / 1e6:.0f} MB; mesh {MESH[0]}x{MESH[1]} on {DEVICE}, "
          f"{RANKS} gloo ranks; peak RSS above each rank's start (the source's sample loaded)"
          + ("; the blocks are on the GPU, the peaks host memory" if DEVICE != "cpu" else ""))
    print(f"| path | rank | its blocks | peak above start | beyond its blocks | / its blocks | / sample | time per sample (median of {REPEATS}) |")
    print("|---|---|---|---|---|---|---|---|")
    walls, firsts, sent, peaks, rows_of = {}, {}, {}, {}, {}
    for how in ("dense", "compact", "indices", "coo"):
        spawn(_worker, args=(str(folder), how), nprocs=RANKS, join=True)  # type: ignore[no-untyped-call]
        rows = [json.loads((folder / f"{how}-{r}.json").read_text()) for r in range(RANKS)]
        rows_of[how] = rows
        walls[how] = statistics.median(max(r["s"][i] for r in rows) for i in range(REPEATS))
        firsts[how] = max(r["s"][0] for r in rows)
        sent[how] = rows[0]["sent"]
        peaks[how] = rows[0]["peak"]
        others = rows[1:]
        for label, row in (("0 (source)", rows[0]), ("1" if RANKS == 2 else f"1-{RANKS - 1} (largest)", max(others, key=lambda r: r["peak"]))):
            print(f"| {how} | {label} | {row['block'] / 1e6:.1f} MB | {row['peak'] / 1e6:.1f} MB | "
                  f"{(row['peak'] - row['block']) / 1e6:+.1f} MB | {row['peak'] / row['block']:.3f} | "
                  f"{row['peak'] / size:.2f} | {walls[how]:.2f} s |")
    for how, held in (("dense", size), ("compact", size), ("indices", given), ("coo", given)):
        total = held + peaks[how]
        print(f"source, {how}: its sample {held / 1e6:.1f} MB + peak above it {peaks[how] / 1e6:.1f} MB = "
              f"{total / 1e6:.1f} MB, {total / size:.2f} of the dense sample")
    print(f"\nbytes of all ranks' buffers: dense {sent['dense'] / 1e6:.1f} MB, compact "
          f"{sent['compact'] / 1e6:.1f} MB (1/{sent['dense'] / max(sent['compact'], 1):.1f}); time compact / dense "
          f"{walls['compact'] / walls['dense']:.2f} ({walls['dense'] / walls['compact']:.2f}x faster), "
          f"indices / dense {walls['indices'] / walls['dense']:.2f} ({walls['dense'] / walls['indices']:.2f}x faster), "
          f"coo / dense {walls['coo'] / walls['dense']:.2f} ({walls['dense'] / walls['coo']:.2f}x faster)")
    floor = statistics.median(max(r["floor"][i] for r in rows_of["dense"]) for i in range(REPEATS))
    print(f"floor (every rank writes its dense blocks in place and wraps them as DTensors, nothing sent): "
          f"{floor:.3f} s per sample; above it: dense {walls['dense'] - floor:.3f} s, compact "
          f"{walls['compact'] - floor:.3f} s ({(walls['dense'] - floor) / (walls['compact'] - floor):.2f}x less), "
          f"indices {walls['indices'] - floor:.3f} s ({(walls['dense'] - floor) / (walls['indices'] - floor):.2f}x less)")
    cpu = {h: [statistics.median(r["cpu"]) for r in rows] for h, rows in rows_of.items()}
    print("CPU per sample (user and system, all threads, median of "
          f"{REPEATS}): the source " + ", ".join(f"{h} {c[0]:.3f} s" for h, c in cpu.items())
          + f" ({cpu['dense'][0] / cpu['indices'][0]:.1f}x less given indices); a receiver (most) "
          + ", ".join(f"{h} {max(c[1:]):.3f} s" for h, c in cpu.items())
          + "; all ranks " + ", ".join(f"{h} {sum(c):.3f} s" for h, c in cpu.items()))
    print("the first sample of each path (fresh memory): " + ", ".join(f"{h} {firsts[h]:.2f} s" for h in firsts))
    print(f"one-hot features and maps given as indices, sparse features as their elements, masks as bool, "
          f"ranged ids as uint8: the sample file {given / 1e6:.1f} MB "
          f"({given / size:.2f} of the dense sample)")


if __name__ == "__main__":
    main()
