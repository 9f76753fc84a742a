"""Benchmark: every rank's block of one Boltz-2-sized sample (N=2048 tokens, ~20k atoms,
S=4096, cp=(3,3)) made by the Rust tch runtime, by the featshard package on the byte
executor (`featshard.blocks`) and by pure Python (the tests' reference), in one run on
one machine, with 1 and 2 threads. Each path runs 3 times in a process (the median
kept), in 3 rounds whose order of paths alternates, so that a machine growing slower
during the run does not favour one path; each round's ratio to the Rust runtime is
printed with the median.

    . scripts/env.sh && cargo build --release && \
        cargo build --release -p featshard-runtime --example time_blocks
    maturin build --release -m python/Cargo.toml -o target/wheels && pip install target/wheels/*.whl
    python benches/python_vs_rust.py

Each path runs in a process of its own that first loads the sample from one safetensors
file; its memory figure is the peak resident set while making the blocks, above what the
process held with the sample loaded (the peak is reset after loading).
"""

from __future__ import annotations

import gc
import importlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_common import (
    ROOT,
    SPEC,
    boltz_sample_file,
    load_resident,
    reset_peak,
    status,
)

MESH = (3, 3)
RUNS = 3


def child(how: str, threads: int, out: Path) -> None:
    """One path, timed in this process: prints `seconds peak_bytes`."""
    torch.set_num_threads(threads)
    sys.path[:0] = [str(out)]
    sample = load_resident(out / "sample.safetensors")
    if how == "package":
        import featshard
        from featshard import blocks

        plan = featshard.Plan(SPEC)

        def run() -> Any:
            return blocks.rank_blocks(plan, sample, MESH, workflow="inference", threads=threads)
    else:
        # Pure Python: the tests' reference (`tests/python/oracle.py`), intake and
        # padding written in torch from the generated module's tables, each rank's
        # window cut with torch.
        sys.path[:0] = [str(ROOT / "tests" / "python")]
        import oracle

        placements = importlib.import_module("boltz2_placements")

        def run() -> Any:
            return oracle.rank_blocks(placements, sample, MESH)

    gc.collect()
    before = reset_peak()
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        made = run()
        times.append(time.perf_counter() - start)
        del made
        gc.collect()
    print(sorted(times)[RUNS // 2], status("VmHWM") - before)


def measure(how: str, threads: int, out: Path) -> tuple[float, int]:
    if how == "rust":
        cmd = [str(ROOT / "target" / "release" / "examples" / "time_blocks"), str(SPEC),
               str(out / "sample.safetensors"), f"{MESH[0]}x{MESH[1]}", "inference", str(threads)]
        line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        fields = dict(kv.split("=") for kv in line.split())
        return float(fields["rust_seconds"]), int(fields["peak_bytes"])
    cmd = [sys.executable, __file__, "--child", how, str(threads), str(out)]
    seconds, peak = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()
    return float(seconds), int(peak)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="featshard-bench-") as folder:
        bench(Path(folder))


ROUNDS = 3
PATHS = [("rust", 1), ("package", 1), ("reference", 1), ("rust", 2), ("package", 2)]
NAMES = {"rust": "rust tch runtime (pad + rank_blocks)",
         "package": "featshard.blocks.rank_blocks",
         "reference": "pure Python (oracle.py: pad + torch cut)"}


def bench(out: Path) -> None:
    n_atoms, serial = boltz_sample_file(out, 2048, 4096)
    gc.collect()
    print(f"sample: 2048 tokens, {n_atoms} atoms, 4096 MSA rows, {serial / 1e9:.2f} GB serial; "
          f"mesh {MESH[0]}x{MESH[1]}; median of {RUNS} in a process, {ROUNDS} rounds; "
          "memory: peak RSS above the loaded sample")
    rounds: list[dict[tuple[str, int], tuple[float, int]]] = []
    for r in range(ROUNDS):
        order = PATHS if r % 2 == 0 else PATHS[::-1]
        rounds.append({path: measure(path[0], path[1], out) for path in order})
    for how, threads in PATHS:
        times = sorted(rnd[how, threads][0] for rnd in rounds)
        peaks = sorted(rnd[how, threads][1] for rnd in rounds)
        rust_times = sorted(rnd["rust", threads][0] for rnd in rounds)
        rust_peaks = sorted(rnd["rust", threads][1] for rnd in rounds)
        s, peak = times[ROUNDS // 2], peaks[ROUNDS // 2]
        per_round = " ".join(
            f"{rnd[how, threads][0] / rnd['rust', threads][0]:.2f}" for rnd in rounds
        )
        print(f"{NAMES[how]:40} threads {threads}: {s:7.3f} s  x{s / rust_times[ROUNDS // 2]:5.2f}"
              f"  (rounds x{per_round})   peak {peak / 1e9:5.2f} GB"
              f"  x{peak / rust_peaks[ROUNDS // 2]:5.2f}")
    print(json.dumps([{f"{h}-{t}": v for (h, t), v in rnd.items()} for rnd in rounds]))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
    else:
        main()
