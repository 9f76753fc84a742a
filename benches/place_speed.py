"""Benchmark: `featshard.blocks.place` (intake and every check of a sample: dtypes,
shapes, lengths, ownership, index ranges, masks 0/1, one-hot rows) on one thread,
against one plain read of the same bytes, in the same run, on a 768-token Boltz-shaped
sample with the optional atom-pair `pair_mask` (a float 0/1 mask, the largest feature).

    . scripts/env.sh && cargo build --release
    maturin build --release -m python/Cargo.toml -o target/wheels && pip install --force-reinstall target/wheels/featshard-*.whl
    python benches/place_speed.py

The sample is made by the tests' `random_sample` (as `bench_common.boltz_sample_file`
makes the others), held in memory. The plain read is numpy's `max` over every tensor's
bytes as `uint8` (one vectorised pass that reads each byte once, single-threaded).
Median of 5 of each, interleaved.
"""

from __future__ import annotations

import importlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from bench_common import REAL_BOND_DENSITY, ROOT, SPEC

RUNS = 5
MESH = (3, 3)


def plain_read(sample: dict[str, torch.Tensor]) -> float:
    start = time.perf_counter()
    for x in sample.values():
        if x.numel():
            np.max(x.contiguous().view(-1).view(torch.uint8).numpy())
    return time.perf_counter() - start


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="featshard-place-") as folder:
        subprocess.run([str(ROOT / "target" / "release" / "featshard"), "generate", str(SPEC),
                        "--out", folder], check=True, capture_output=True)
        sys.path[:0] = [folder, str(ROOT / "tests" / "python")]
        placements = importlib.import_module("boltz2_placements")
        from boltz_samples import random_sample

        sample = random_sample(placements, 768, seed=1, atoms_per_token=(0, 12), msa_rows=2048,
                               templates=4, ensemble=1, sparse_density=REAL_BOND_DENSITY)
        import featshard
        from featshard import blocks

        plan = featshard.Plan(SPEC)
        size = sum(x.numel() * x.element_size() for x in sample.values())
        pair = sample["pair_mask"]
        print(f"sample: 768 tokens, {int(sample['atom_counts_per_token'].sum())} atoms, 2048 MSA rows, "
              f"{size / 1e6:.0f} MB (pair_mask {tuple(pair.shape)} float32, "
              f"{pair.numel() * 4 / 1e6:.0f} MB); mesh {MESH[0]}x{MESH[1]}, one thread\n")
        blocks.place(plan, sample, MESH, workflow="inference")  # first call: imports, caches
        reads, places = [], []
        for _ in range(RUNS):
            reads.append(plain_read(sample))
            start = time.perf_counter()
            blocks.place(plan, sample, MESH, workflow="inference", threads=1)
            places.append(time.perf_counter() - start)
        read, place = statistics.median(reads), statistics.median(places)
        print("| step | time | sample / s | / plain read |")
        print("|---|---|---|---|")
        print(f"| plain read (numpy max over every byte) | {read * 1e3:.0f} ms | {size / read / 1e9:.2f} GB/s | 1.00 |")
        print(f"| `featshard.blocks.place` (intake, every check) | {place * 1e3:.0f} ms | "
              f"{size / place / 1e9:.2f} GB/s | {place / read:.2f} |")
        print(f"runs: read {' '.join(f'{r * 1e3:.0f}' for r in reads)} ms; "
              f"place {' '.join(f'{p * 1e3:.0f}' for p in places)} ms")


if __name__ == "__main__":
    main()
