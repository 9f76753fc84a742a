"""What the Python benchmarks share: memory figures from /proc, and one Boltz-2-shaped
sample written to a safetensors file next to the modules generated for it."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "boltz2.yaml"


def status(field: str) -> int:
    """A /proc/self/status figure, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> int:
    """Resets this process's peak resident set; returns the resident set now."""
    Path("/proc/self/clear_refs").write_text("5")
    return status("VmRSS")


def load_resident(path: Path) -> dict[str, Any]:
    """A safetensors sample copied out of the file's memory map, so that it is resident
    before a peak is reset (a mapped sample's pages would count when first read)."""
    from safetensors.torch import load_file

    loaded = load_file(str(path))
    sample = {name: x.clone() for name, x in loaded.items()}
    del loaded
    return sample


def as_coo(sample: dict[str, Any], dense_file: Path) -> dict[str, Any]:
    """A sample whose sparse features are given as their elements (``NAME.indices``,
    ``NAME.values``, as a safetensors file holds them) with each as a
    ``torch.sparse_coo_tensor`` instead, as a featurizer in memory hands it over (its
    size read from the dense sample file's header)."""
    import torch
    from safetensors import safe_open

    out = dict(sample)
    with safe_open(str(dense_file), framework="pt") as f:
        for key in [k for k in sample if k.endswith(".indices")]:
            name = key.removesuffix(".indices")
            size = f.get_slice(name).get_shape()
            out[name] = torch.sparse_coo_tensor(out.pop(key), out.pop(f"{name}.values"), size)
    return out


# Nonzero share of the real samples' bonds (`token_bonds`, `type_bonds`: 0.49%).
REAL_BOND_DENSITY = 0.005


def boltz_sample_file(folder: Path, tokens: int, msa_rows: int,
                      atoms_per_token: tuple[int, int] = (0, 20), pair_mask: bool = True) -> tuple[int, int]:
    """Generates the boltz2 modules into `folder` and writes a random sample of `tokens`
    tokens and `msa_rows` MSA rows to `folder/sample.safetensors`; returns its atom count
    and serial bytes."""
    from safetensors.torch import save_file

    subprocess.run([str(ROOT / "target" / "release" / "featshard"), "generate", str(SPEC),
                    "--out", str(folder)], check=True, capture_output=True)
    sys.path[:0] = [str(folder), str(ROOT / "tests" / "python")]
    placements = importlib.import_module("boltz2_placements")
    from boltz_samples import random_sample

    sample = random_sample(placements, tokens, seed=1, atoms_per_token=atoms_per_token,
                           msa_rows=msa_rows, templates=4, ensemble=1, sparse_density=REAL_BOND_DENSITY)
    if not pair_mask:
        sample.pop("pair_mask")  # optional, [atoms, atoms]; the Boltz-2 featurizer does not emit it
    n_atoms = int(sample["atom_counts_per_token"].sum())
    serial = sum(t.numel() * t.element_size() for t in sample.values())
    save_file(sample, str(folder / "sample.safetensors"))
    return n_atoms, serial
