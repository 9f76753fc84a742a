"""Benchmark: `featshard shard` as a whole process against the disk's floor and a plain
PyTorch pad-and-save script, on one Boltz-2-shaped sample (1024 tokens, 2048 MSA rows),
mesh 3x3, in one run, rank files dense and compact (`--encoding`); then a dataset of
small samples at --jobs 1 and --jobs 2.

    cargo build --release   # no features: `featshard shard` links no libtorch
    ~/.cache/featshard/venv/bin/python benches/shard_disk.py

Every step is a whole process timed by /usr/bin/time (wall clock and the peak resident
set it reports, the touched pages of memory maps included), median of RUNS, the three
interleaved, the sample in the page cache, each started after `sync` so that none pays
for the previous one's writeback. The floor is one read of the sample
(`cat SAMPLE > /dev/null`) plus one write of the same bytes into the same number of
files (`cp -r` of featshard's own output folder, read from the page cache).
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release" / "featshard"
SPEC = ROOT / "examples" / "boltz2.yaml"
PY = sys.executable
RUNS = 3
MESH = "3x3"


def timed(cmd: list[str] | str) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of a whole process, started with no dirty pages
    left by the step before (each writes ~700 MB, which the kernel flushes later)."""
    os.sync()
    shell = isinstance(cmd, str)
    argv = ["/usr/bin/time", "-v", "sh", "-c", cmd] if shell else ["/usr/bin/time", "-v", *cmd]
    start = time.perf_counter()
    run = subprocess.run(argv, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if run.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{run.stderr}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr).group(1))
    return wall, rss * 1024


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def make_samples(work: Path) -> tuple[Path, Path]:
    sys.path[:0] = [str(work / "gen"), str(ROOT / "tests" / "python")]
    subprocess.run([str(BIN), "generate", str(SPEC), "--out", str(work / "gen")], check=True)
    placements = importlib.import_module("boltz2_placements")
    from boltz_samples import random_sample
    from safetensors.torch import save_file

    def sample(n_tokens: int, msa_rows: int, seed: int) -> dict[str, object]:
        s = random_sample(placements, n_tokens, seed=seed, atoms_per_token=(0, 20),
                          msa_rows=msa_rows, templates=4, ensemble=1, sparse_density=0.005)  # as the real bonds
        s.pop("pair_mask")  # optional, [atoms, atoms]; the Boltz-2 featurizer does not emit it
        return s

    big = work / "sample.safetensors"
    save_file(sample(1024, 2048, 1), str(big))
    small = work / "dataset"
    small.mkdir()
    for i in range(32):
        save_file(sample(256, 512, 100 + i), str(small / f"s{i:02d}.safetensors"))
    return big, small


DENSE = ("--encoding", "dense")


def shard_cmd(inputs: Path, out: Path, *extra: str) -> list[str]:
    return [str(BIN), "shard", str(SPEC), "--features", str(inputs), "--mesh", MESH,
            "--workflow", "inference", "--out", str(out), *extra]


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="featshard-disk-"))
    try:
        big, small = make_samples(work)
        size = big.stat().st_size
        subprocess.run(["cat", str(big)], stdout=subprocess.DEVNULL, check=True)
        ref, packed = work / "ref", work / "packed"
        subprocess.run(shard_cmd(big, ref, *DENSE), check=True, capture_output=True)
        subprocess.run(shard_cmd(big, packed), check=True, capture_output=True)
        written = sum(f.stat().st_size for f in ref.iterdir())
        compact = sum(f.stat().st_size for f in packed.iterdir())
        files = len(list(ref.glob("rank-*.safetensors")))
        rows: dict[str, list[tuple[float, int]]] = {"featshard": [], "featshard2": [], "compact": [],
                                                    "compact2": [], "floor": [], "torch": [], "start": []}
        for i in range(RUNS):
            rows["start"].append(timed([str(BIN), "--version"]))
            out = work / f"out{i}"
            for key, extra in (("featshard", DENSE), ("featshard2", (*DENSE, "--threads", "2")),
                               ("compact", ()), ("compact2", ("--threads", "2"))):
                rows[key].append(timed(shard_cmd(big, out, *extra)))
                shutil.rmtree(out)
            rows["floor"].append(timed(f"cat {big} > /dev/null && cp -r {ref} {out}"))
            shutil.rmtree(out)
            rows["torch"].append(timed([PY, str(ROOT / "benches" / "torch_pad_save.py"), str(big),
                                        str(ref / "manifest.json"), str(out)]))
            shutil.rmtree(out)
        t = {k: median([w for w, _ in v]) for k, v in rows.items()}
        rss = {k: max(r for _, r in v) for k, v in rows.items()}
        print(f"sample: {size / 1e6:.0f} MB; {files} rank files, {written / 1e6:.0f} MB written dense, "
              f"{compact / 1e6:.1f} MB compact (1/{written / compact:.1f}); mesh {MESH}; "
              f"median of {RUNS} whole processes")
        print("| process | wall | / floor | featshard / it | peak RSS | RSS / sample |")
        print("|---|---|---|---|---|---|")
        for k, label in [("featshard", "`featshard shard --encoding dense`"),
                         ("featshard2", "`featshard shard --encoding dense --threads 2`"),
                         ("compact", "`featshard shard` (compact)"),
                         ("compact2", "`featshard shard --threads 2` (compact)"),
                         ("floor", "floor: `cat` the sample + `cp -r` the rank files"),
                         ("torch", "plain PyTorch pad + split + `save_file`"),
                         ("start", "`featshard --version` (process start)")]:
            print(f"| {label} | {t[k]:.3f} s | {t[k] / t['floor']:.2f} | {t['featshard'] / t[k]:.2f} | "
                  f"{rss[k] / 1e6:.0f} MB | {rss[k] / size:.2f} |")
        print("runs (dense, dense --threads 2, compact, compact --threads 2, floor, torch, start): "
              + "; ".join(" ".join(f"{w:.2f}" for w, _ in rows[k]) for k in rows))
        data_rows = []
        for jobs in ("1", "2") * 3:
            out = work / f"ds{jobs}"
            wall, _ = timed(shard_cmd(small, out, "--jobs", jobs, "--threads", "1"))
            data_rows.append((jobs, wall))
            shutil.rmtree(out)
        n = len(list(small.iterdir()))
        one = median([w for j, w in data_rows if j == "1"])
        two = median([w for j, w in data_rows if j == "2"])
        print(f"dataset: {n} samples, {sum(f.stat().st_size for f in small.iterdir()) / 1e6:.0f} MB; "
              f"--jobs 1: {one:.2f} s ({n / one:.1f} samples/s), --jobs 2: {two:.2f} s "
              f"({n / two:.1f} samples/s); throughput ratio {one / two:.2f} "
              f"(runs: {' '.join(f'{j}:{w:.2f}' for j, w in data_rows)})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
