"""Benchmark: a rank's blocks made on its GPU, compact against dense. For each of the nine
ranks of a 3x3 mesh, a Boltz-2-shaped sample's blocks (1024 tokens unless told) reach
the device two ways: the dense blocks moved by `.to(device)` (what the dense path does),
and the rank's compact buffer moved whole and its compact blocks expanded there by torch
(`featshard.distribute._local_blocks` with `featshard.blocks.expand_on_device`, what
`distribute_features` does on a CUDA mesh). Every expanded block is compared with the
dense one on the device, byte for byte; the bytes that cross to the device and the
time of each way (median of 5, the device synchronised) are printed, and the part of
the compact way the host spends (until the call returns: from pinned memory nothing in
it waits for the device).

    . scripts/env.sh && cargo build --release
    maturin build --release -m python/Cargo.toml -o target/wheels && pip install --force-reinstall target/wheels/featshard-*.whl
    python benches/cuda_expand.py            # on the first CUDA device
    python benches/cuda_expand.py cuda 2048  # a 2048-token sample
    python benches/cuda_expand.py cpu        # the comparison on the host: no GPU needed

On the host, `.to("cpu")` moves nothing: the `cpu` run checks the blocks and times
torch's expansion only.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

import torch
from bench_common import SPEC, boltz_sample_file, load_resident

MESH = (3, 3)
REPEATS = 5


def _timed(
    device: torch.device, make: Callable[[], dict[str, torch.Tensor]]
) -> tuple[float, float, dict[str, torch.Tensor]]:
    """The median times of `make` over REPEATS until the device has finished its work,
    and until `make` returned (the host's part: what a loader thread spends), and its
    result."""
    done: list[float] = []
    returned: list[float] = []
    out: dict[str, torch.Tensor] = {}
    for _ in range(REPEATS):
        out = {}
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = make()
        returned.append(time.perf_counter() - start)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        done.append(time.perf_counter() - start)
    return statistics.median(done), statistics.median(returned), out


def _moved(blocks: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {n: x.to(device, non_blocking=True) for n, x in blocks.items()}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def main() -> None:
    where = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    if where == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run `python benches/cuda_expand.py cpu` for the host comparison")
    device = torch.device(where)
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    import featshard
    from featshard import _native, blocks
    from featshard.distribute import _local_blocks

    with tempfile.TemporaryDirectory(prefix="featshard-cuda-expand-") as folder:
        atoms, size = boltz_sample_file(Path(folder), tokens, 2048, (0, 20), pair_mask=False)
        sample = load_resident(Path(folder) / "sample.safetensors")
    plan = featshard.Plan(SPEC)
    placed = blocks.place(plan, sample, MESH, workflow="inference")
    dense_wire, compact_wire = placed.wire(), placed.wire(compact=True)
    print(f"sample: {tokens} tokens, {atoms} atoms, {size / 1e6:.0f} MB; mesh {MESH[0]}x{MESH[1]}; device {device}")
    print("| rank | dense bytes to the device | compact bytes | dense: .to(device) | compact: moved and expanded "
          "| compact: the host's part | identical |")
    print("|---|---|---|---|---|---|---|")
    totals = [0.0, 0.0]
    # Once untimed: the device's first use (its context, torch's kernels) is no rank's.
    first = _native.coords(MESH, 0)
    _moved(blocks.buffer_views(placed.rank_buffer(first), dense_wire), device)
    _local_blocks(plan, placed.rank_buffer(first, compact=True), compact_wire, device)
    for k in range(MESH[0] * MESH[1]):
        coord = _native.coords(MESH, k)
        # Pinned host memory, as a loader hands the GPU its batches.
        dense = blocks.buffer_views(placed.rank_buffer(coord).pin_memory() if where == "cuda"
                                    else placed.rank_buffer(coord), dense_wire)
        stored = placed.rank_buffer(coord, compact=True)
        moved_s, _, moved = _timed(device, partial(_moved, dense, device))
        # The whole buffer crosses: blocks with no compact form are views of it there.
        made_s, host_s, made = _timed(device, partial(_local_blocks, plan, stored.pin_memory() if where == "cuda"
                                              else stored, compact_wire, device))
        same = all(_same(made[n], moved[n]) for n in moved)
        dense_bytes = sum(x.numel() * x.element_size() for x in dense.values())
        print(f"| {coord} | {dense_bytes / 1e6:.1f} MB | {stored.numel() / 1e6:.2f} MB | {moved_s * 1e3:.1f} ms | "
              f"{made_s * 1e3:.1f} ms | {host_s * 1e3:.1f} ms | {'yes' if same else 'NO'} |")
        totals[0] += moved_s
        totals[1] += made_s
        if not same:
            bad = [n for n in moved if not _same(made[n], moved[n])]
            sys.exit(f"rank {coord}: expanded blocks differ from the dense ones: {bad}")
    print(f"all ranks: dense {totals[0] * 1e3:.1f} ms, compact {totals[1] * 1e3:.1f} ms "
          f"({totals[0] / totals[1]:.2f}x)")


if __name__ == "__main__":
    main()
