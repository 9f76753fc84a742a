"""Benchmark: the generated Python pipeline and the Rust runtime producing every rank's
block of one Boltz-2-sized sample (N=2048 tokens, ~20k atoms, S=4096, cp=(3,3)), in
one run on one machine, one thread each. Median of 3 runs each.

    . scripts/env.sh && cargo build --release -p featshard-runtime --example time_blocks
    python benches/python_vs_rust.py
"""

from __future__ import annotations

import gc
import importlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
MESH = (3, 3)


def main() -> None:
    torch.set_num_threads(1)
    out = Path(tempfile.mkdtemp(prefix="featshard-bench-"))
    subprocess.run([str(ROOT / "target" / "release" / "featshard"), "generate",
                    str(ROOT / "examples" / "boltz2.yaml"), "--out", str(out)], check=True)
    sys.path[:0] = [str(out), str(ROOT / "tests" / "python")]
    placements = importlib.import_module("boltz2_placements")
    data = importlib.import_module("boltz2_placements_data")
    from boltz_samples import random_sample

    sample = random_sample(placements, 2048, seed=1, atoms_per_token=(0, 20), msa_rows=4096,
                           templates=4, ensemble=1)
    n_atoms = int(sample["atom_counts_per_token"].sum())
    serial = sum(t.numel() * t.element_size() for t in sample.values())
    times = []
    for _ in range(3):
        start = time.perf_counter()
        blocks = data.rank_blocks(sample, MESH)
        times.append(time.perf_counter() - start)
        del blocks
        gc.collect()
    py = sorted(times)[1]
    path = out / "sample.safetensors"
    save_file(sample, str(path))
    del sample
    gc.collect()
    rust_bin = ROOT / "target" / "release" / "examples" / "time_blocks"
    line = subprocess.run([str(rust_bin), str(ROOT / "examples" / "boltz2.yaml"), str(path),
                           f"{MESH[0]}x{MESH[1]}", "inference"],
                          check=True, capture_output=True, text=True).stdout.strip()
    fields = dict(kv.split("=") for kv in line.split())
    rust = float(fields["rust_seconds"])
    padded = int(fields["padded_bytes"])
    print(f"sample: 2048 tokens, {n_atoms} atoms, 4096 MSA rows, {serial / 1e9:.2f} GB serial, "
          f"{padded / 1e9:.2f} GB padded; mesh {MESH[0]}x{MESH[1]}; one thread each")
    print(f"python (generated module): {py:7.3f} s  {padded / py / 1e9:5.2f} GB/s")
    print(f"rust   (featshard-runtime): {rust:7.3f} s  {padded / rust / 1e9:5.2f} GB/s")
    print(f"python / rust time ratio:   {py / rust:7.2f}")


if __name__ == "__main__":
    main()
