"""Bytes `distribute_features` sends per real Boltz-2 sample, one-hot features and maps
dense and compact (as indices), on 1x1, 2x2 and 3x3.

    python benches/compact_bytes.py    # the featshard virtual environment's python
"""

from __future__ import annotations

import sys

from bench_common import ROOT, SPEC

sys.path.insert(0, str(ROOT / "tests" / "python"))

import featshard
from boltz_samples import REAL_NAMES, real_samples
from featshard import blocks


def main() -> None:
    plan = featshard.Plan(SPEC)
    print("| sample | serial | mesh | sent dense | sent compact | compact / dense |")
    print("|---|---|---|---|---|---|")
    for name, sample in zip(REAL_NAMES, real_samples()):
        serial = sum(x.numel() * x.element_size() for x in sample.values())
        for mesh in [(1, 1), (2, 2), (3, 3)]:
            placed = blocks.place(plan, sample, mesh, workflow="inference")
            ranks = mesh[0] * mesh[1]
            dense = placed.buffer_offsets()[1] * ranks
            compact = placed.buffer_offsets(compact=True)[1] * ranks
            print(f"| {name} | {serial / 1e6:.2f} MB | {mesh[0]}x{mesh[1]} | {dense / 1e6:.2f} MB | "
                  f"{compact / 1e6:.3f} MB | 1/{dense / compact:.1f} |")


if __name__ == "__main__":
    main()
