"""The baseline of benches/shard_disk.py: what a plain PyTorch script does to pre-shard
a sample. Loads it with safetensors, pads every feature to its padded shape, splits it
along its sharded axes and saves one safetensors file per rank, as a user would write it
by hand. Shapes and placements come from a featshard manifest of the same sample, so
both write the same bytes into the same files.

    python benches/torch_pad_save.py SAMPLE MANIFEST OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def main(sample_path: str, manifest_path: str, out: str) -> None:
    torch.set_num_threads(1)
    manifest = json.loads(Path(manifest_path).read_text())
    # The mesh's sizes, one per axis (the layout's; `mesh` names the axes); a 2-D tile here.
    mesh = manifest["layout"]["mesh"]
    sample = load_file(sample_path)
    padded: dict[str, torch.Tensor] = {}
    for name, f in manifest["features"].items():
        x = sample.get(name)
        dtype = getattr(torch, f["dtype"])
        p = torch.zeros(f["padded_shape"], dtype=dtype)
        if x is not None:
            p[tuple(slice(0, n) for n in x.shape)] = x
        padded[name] = p
    del sample
    Path(out).mkdir(parents=True)
    for rank in range(mesh[0] * mesh[1]):
        coord = (rank // mesh[1], rank % mesh[1])
        blocks = {}
        for name, f in manifest["features"].items():
            x = padded[name]
            sharded_by = 0
            for m, placement in enumerate(f["placements"]):
                if isinstance(placement, dict) and "shard" in placement:
                    x = x.chunk(mesh[m], dim=placement["shard"])[coord[m]]
                    sharded_by = m
            # A co-sharded axis keeps the diagonal block of the axis it follows.
            for d, n in enumerate(f["local_shape"]):
                if x.shape[d] > n:
                    x = x.narrow(d, coord[sharded_by] * n, n)
            blocks[name] = x.contiguous()
        save_file(blocks, str(Path(out) / f"rank-{rank}.safetensors"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
