"""The size context parallelism exists for: a 30,000-token Boltz-shaped sample in
compact input form on an 8x8 mesh (64 ranks), on this machine.

    . scripts/env.sh && cargo build --release
    maturin build --release -m python/Cargo.toml -o target/wheels && pip install --force-reinstall target/wheels/featshard-*.whl
    python benches/cp30k.py            # FEATSHARD_BENCH_DIR=... to write the sample elsewhere

The sample is synthetic, built like the real ones (the tests' `random_sample` rules):
29,880 polymer tokens of 8 atoms and three 40-atom ligands of one token per atom
(239,160 atoms), 256 MSA rows, one template. Its one-hot features and maps are given as
their indices (as a featurizer that skips its final one-hot calls writes them); the
nearly empty pair features (`token_bonds`, `type_bonds`, `contact_threshold`, declared
`sparse`) as their nonzero elements (`NAME.indices`, `NAME.values`: as many per token as
the real sample with a ligand has). The dense sample it stands for cannot be made on
this machine.

One process is the source: it memory-maps the sample (numpy, no copy), validates and
places it (`featshard.blocks.place`, two threads), then writes the compact buffer of four
ranks, one at a time, to files (what it would send). Then one process per measured rank
expands its buffer into its dense blocks (`featshard.blocks.expand`). Peak memory is the
peak resident set above the process's start (mapped pages the source reads count).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import ROOT, SPEC, reset_peak, status

MESH = (8, 8)
# FEATSHARD_CP_POLYMER sets a smaller sample (for profiling); 29,880 by default.
POLYMER = int(os.environ.get("FEATSHARD_CP_POLYMER", "29880"))
LIGANDS, LIGAND_ATOMS, ATOMS_PER_TOKEN = 3, 40, 8
MSA_ROWS, TEMPLATES = 256, 1
RANKS = [(0, 0), (3, 5), (7, 7), (4, 2)]
SPARSE = ("token_bonds", "type_bonds", "contact_threshold")
MAPS = ("atom_to_token", "token_to_rep_atom", "r_set_to_rep_atom")
NP = {"bool": np.bool_, "uint8": np.uint8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
      "float32": np.float32, "float64": np.float64}
ST = {"bool": "BOOL", "uint8": "U8", "int16": "I16", "int32": "I32", "int64": "I64", "float32": "F32",
      "float64": "F64"}


def tables(folder: Path) -> Any:
    subprocess.run([str(ROOT / "target" / "release" / "featshard"), "generate", str(SPEC), "--out",
                    str(folder)], check=True, capture_output=True)
    sys.path.insert(0, str(folder))
    return importlib.import_module("boltz2_placements")


def layout() -> dict[str, Any]:
    counts = np.array([ATOMS_PER_TOKEN] * POLYMER + [1] * (LIGANDS * LIGAND_ATOMS), dtype=np.int64)
    tokens, atoms = len(counts), int(counts.sum())
    first = np.cumsum(counts) - counts
    return {"counts": counts, "tokens": tokens, "atoms": atoms, "first": first,
            "token_of_atom": np.repeat(np.arange(tokens, dtype=np.int32), counts)}


def plan_tensors(P: Any, lay: dict[str, Any]) -> list[tuple[str, str, list[int], Any]]:
    """Every input tensor: name, stored dtype, stored shape, and how to fill it (an
    array, a callable of (start, rows), or "sparse")."""
    n, a = lay["tokens"], lay["atoms"]
    lengths = {"tokens": n, "atoms": a, "rset": n, "msa": MSA_ROWS, "ensemble": 1, "disto_ensemble": 1,
               "templates": TEMPLATES}
    for i, sem in enumerate(s for s in P.SEMANTICS if s not in lengths):
        lengths[sem] = 0 if i == 0 else 1 + i % 3
    rng = np.random.default_rng(1)
    incoming = {i[1] for i in (s.incoming for s in P.SEMANTICS.values()) if i is not None and i[0] == "mask"}
    out = []
    for name in sorted(P.WORKFLOWS["inference"]):
        if name in P.METADATA_FEATURES or name in P.DERIVED or name == "pair_mask":
            continue
        axes = P.FEATURE_AXIS_SEMANTICS[name]
        shape = [lengths[s] if s is not None else int(c) for s, c in zip(axes, P.CHANNEL_SIZES[name])]
        dtype = str(P.DTYPES[name]).removeprefix("torch.")
        role = P.INDEX_FEATURES.get(name)
        if name in MAPS:
            of = {"atom_to_token": lay["token_of_atom"], "token_to_rep_atom": lay["first"].astype(np.int32),
                  "r_set_to_rep_atom": lay["first"].astype(np.int32)}[name]
            out.append((name, "int32", shape[:1], of))
        elif name in P.ONE_HOT:
            classes = shape[-1]
            def fill(start: int, rows: int, shape: list[int] = shape[:-1], k: int = classes) -> Any:
                inner = math.prod(shape[1:])
                return rng.integers(0, k, rows * inner, dtype=np.uint8).reshape(rows, *shape[1:])
            out.append((name, "uint8", shape[:-1], fill if axes.count("tokens") > 1 else fill(0, shape[0])))
        elif name in SPARSE:
            # As many bonds per token as the real sample with a ligand (26 in 73 tokens),
            # each between a token and the next: the elements, never the dense pairs.
            k = n * 36 // 100
            first = np.sort(rng.choice(n - 1, k, replace=False))
            at = np.stack([first, first + 1, *([np.zeros(k, dtype=np.int64)] * (len(shape) - 2))])
            out.append((f"{name}.indices", "int64", [len(shape), k], at.astype(np.int64)))
            out.append((f"{name}.values", dtype, [k], np.ones(k, dtype=NP[dtype])))
        elif name in P.MASKS:  # as bool: a mask may be given so
            out.append((name, "bool", shape, np.ones(shape, dtype=np.bool_)))
        elif name in incoming or dtype == "bool":
            out.append((name, dtype, shape, np.ones(shape, dtype=NP[dtype])))
        elif name == "atom_counts_per_token":
            out.append((name, dtype, shape, lay["counts"]))
        elif name == "token_index":
            out.append((name, dtype, shape, np.arange(n, dtype=np.int64)))
        elif role is not None and role.one_hot is None and role.of == "atoms" or name == "frames_idx":
            out.append((name, dtype, shape, rng.integers(0, a, shape, dtype=np.int64).astype(NP[dtype])))
        elif name in P.RANGES:  # as uint8: ranged ids may be given in a type holding the range
            lo, hi = P.RANGES[name]
            narrow = "uint8" if 0 <= lo and hi <= 255 else dtype
            out.append((name, narrow, shape, rng.integers(lo, hi + 1, shape, dtype=np.int64).astype(NP[narrow])))
        elif dtype.startswith("float"):
            out.append((name, dtype, shape, (rng.random(shape) + 0.5).astype(NP[dtype])))
        else:
            out.append((name, dtype, shape, rng.integers(1, 7, shape, dtype=np.int64).astype(NP[dtype])))
    return out


def dense_bytes(P: Any, lay: dict[str, Any], name: str, stored: list[int]) -> int:
    """Bytes of `name` dense, as the featurizer would emit it, from its stored shape (a
    sparse feature's coordinates stand for all of it, its values for nothing more)."""
    if name.endswith(".values"):
        return 0
    if name.endswith(".indices"):
        name = name.removesuffix(".indices")
        sizes = [lay["tokens"] if s == "tokens" else int(c) for s, c in
                 zip(P.FEATURE_AXIS_SEMANTICS[name], P.CHANNEL_SIZES[name])]
        return math.prod(sizes) * P.DTYPES[name].itemsize
    width = P.CHANNEL_SIZES[name][-1] if name in P.ONE_HOT else (
        lay["tokens"] if name == "atom_to_token" else lay["atoms"]) if name in MAPS else 1
    return math.prod(stored) * width * P.DTYPES[name].itemsize


def write_sample(path: Path, tensors: list[tuple[str, str, list[int], Any]]) -> dict[str, int]:
    """A safetensors file (8-byte dtypes first, so every tensor is aligned). Returns each
    tensor's data offset."""
    order = sorted(tensors, key=lambda t: (-np.dtype(NP[t[1]]).itemsize, t[0]))
    header, at, offsets = {}, 0, {}
    for name, dtype, shape, _ in order:
        size = math.prod(shape) * np.dtype(NP[dtype]).itemsize
        header[name] = {"dtype": ST[dtype], "shape": shape, "data_offsets": [at, at + size]}
        offsets[name], at = at, at + size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for name, dtype, shape, fill in order:
            f.seek(start + offsets[name])
            if isinstance(fill, np.ndarray):
                f.write(np.ascontiguousarray(fill, dtype=NP[dtype]).tobytes())
            else:
                f.writelines(fill(r, min(1000, shape[0] - r)).tobytes() for r in range(0, shape[0], 1000))
        f.truncate(start + at)
    return {name: start + off for name, off in offsets.items()}


def mapped(path: Path, tensors: list[tuple[str, str, list[int], Any]], offsets: dict[str, int]) -> dict[str, Any]:
    import torch

    return {name: torch.from_numpy(np.memmap(path, dtype=NP[dtype], mode="r", offset=offsets[name],
                                             shape=tuple(shape)) if math.prod(shape) else
                                   np.zeros(shape, dtype=NP[dtype]))
            for name, dtype, shape, _ in tensors}


def source(work: Path) -> None:
    import warnings

    import featshard
    from featshard import blocks

    warnings.filterwarnings("ignore")  # read-only memmaps become torch tensors unwritten
    P = tables(work / "gen")
    lay = layout()
    tensors = plan_tensors(P, lay)
    offsets = json.loads((work / "offsets.json").read_text())
    plan = featshard.Plan(SPEC)
    before = reset_peak()
    sample = mapped(work / "sample.safetensors", tensors, offsets)
    start = time.perf_counter()
    placed = blocks.place(plan, sample, MESH, workflow="inference", threads=2)
    placing = time.perf_counter() - start
    peak_place = status("VmHWM") - before
    wire = placed.wire(compact=True)
    dense = sum(math.prod(shape) * dtype.itemsize for dtype, shape in placed.features.values())
    ranks = []
    for coord in RANKS:
        start = time.perf_counter()
        buf = placed.rank_buffer(coord, threads=1, compact=True)
        took = time.perf_counter() - start
        buf.numpy().tofile(work / f"rank-{coord[0]}-{coord[1]}.bin")
        ranks.append({"coord": coord, "bytes": buf.numel(), "s": took})
        del buf
    (work / "wire.bin").write_bytes(wire.to_bytes())
    (work / "source.json").write_text(json.dumps({
        "place_s": placing, "peak_place": peak_place, "peak": status("VmHWM") - before,
        "ranks": ranks, "dense_blocks": dense}))


def receiver(work: Path, coord: tuple[int, int]) -> None:
    import featshard
    import torch
    from featshard import blocks

    torch.set_num_threads(1)
    plan = featshard.Plan(SPEC)
    from featshard import _native

    wire = _native.BufferLayout.from_bytes((work / "wire.bin").read_bytes())
    buf = torch.from_numpy(np.fromfile(work / f"rank-{coord[0]}-{coord[1]}.bin", dtype=np.uint8))
    before = reset_peak()
    start = time.perf_counter()
    dense = blocks.expand(plan, blocks.buffer_views(buf, wire), wire)
    took = time.perf_counter() - start
    nbytes = sum(x.numel() * x.element_size() for x in dense.values())
    peak = status("VmHWM") - before
    (work / f"rank-{coord[0]}-{coord[1]}.json").write_text(json.dumps(
        {"s": took, "peak": peak, "dense": nbytes, "compact": buf.numel()}))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--source":
        return source(Path(sys.argv[2]))
    if len(sys.argv) > 2 and sys.argv[1] == "--receiver":
        return receiver(Path(sys.argv[2]), (int(sys.argv[3]), int(sys.argv[4])))
    with tempfile.TemporaryDirectory(prefix="featshard-cp30k-", dir=os.environ.get("FEATSHARD_BENCH_DIR")) as d:
        work = Path(d)
        P = tables(work / "gen")
        lay = layout()
        tensors = plan_tensors(P, lay)
        start = time.perf_counter()
        offsets = write_sample(work / "sample.safetensors", tensors)
        made = time.perf_counter() - start
        (work / "offsets.json").write_text(json.dumps(offsets))
        stored = (work / "sample.safetensors").stat().st_size
        dense = sum(dense_bytes(P, lay, n, s) for n, _, s, _ in tensors)
        print(f"sample: {lay['tokens']} tokens, {lay['atoms']} atoms, {MSA_ROWS} MSA rows, {TEMPLATES} template; "
              f"mesh {MESH[0]}x{MESH[1]}; written in {made:.0f} s")
        print(f"compact input: {stored / 1e9:.2f} GB; the dense sample it stands for: {dense / 1e9:.0f} GB "
              f"({dense / stored:.0f}x)")
        here = [sys.executable, __file__]
        subprocess.run([*here, "--source", str(work)], check=True)
        src = json.loads((work / "source.json").read_text())
        print(f"source: validate and place {src['place_s']:.1f} s, peak {src['peak_place'] / 1e9:.2f} GB above its start; "
              f"with four ranks' buffers written, peak {src['peak'] / 1e9:.2f} GB")
        print("| rank | compact buffer | written by the source | its dense blocks | expanded in | peak | peak / dense |")
        print("|---|---|---|---|---|---|---|")
        rows = []
        for r in src["ranks"]:
            i, j = r["coord"]
            subprocess.run([*here, "--receiver", str(work), str(i), str(j)], check=True)
            got = json.loads((work / f"rank-{i}-{j}.json").read_text())
            rows.append((r, got))
            print(f"| ({i}, {j}) | {r['bytes'] / 1e6:.1f} MB | {r['s']:.2f} s | {got['dense'] / 1e9:.2f} GB | "
                  f"{got['s']:.2f} s | {got['peak'] / 1e9:.2f} GB | {got['peak'] / got['dense']:.2f} |")
        per = sum(r["bytes"] for r, _ in rows) / len(rows)
        write = sum(r["s"] for r, _ in rows) / len(rows)
        expand = sum(g["s"] for _, g in rows) / len(rows)
        world = MESH[0] * MESH[1]
        print(f"all {world} ranks, extrapolated: the source sends {world} buffers of the same layout "
              f"({world} x {per / 1e6:.1f} MB = {world * per / 1e9:.2f} GB, against "
              f"{world * rows[0][1]['dense'] / 1e9:.0f} GB dense) and writes them one at a time: "
              f"{src['place_s']:.1f} s + {world} x {write:.2f} s = {src['place_s'] + world * write:.0f} s on one "
              f"thread of this machine; each rank expands its own in {expand:.1f} s, in parallel.")


if __name__ == "__main__":
    main()
