"""Cross-language parity: `featshard shard` (Rust) and the generated Python module give
byte-identical blocks for every feature and rank."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import ModuleType

import oracle
import pytest
import torch
from boltz_samples import REAL, REAL_NAMES, random_sample, real_samples
from conftest import ROOT, featshard_bin
from safetensors.torch import load_file, save_file


@pytest.mark.parametrize("mesh", [(3, 3), (2, 3)])
def test_rust_shard_files_equal_python_blocks_byte_for_byte(
    placements: ModuleType, tmp_path: Path, mesh: tuple[int, int]
) -> None:
    sample = random_sample(placements, 17, seed=mesh[0] * 10 + mesh[1])
    save_file(sample, str(tmp_path / "sample.safetensors"))
    out = tmp_path / "shards"
    subprocess.run(
        [
            str(featshard_bin()), "shard", str(ROOT / "examples" / "boltz2.yaml"), "--encoding", "dense",
            "--features", str(tmp_path / "sample.safetensors"), "--mesh", f"{mesh[0]}x{mesh[1]}",
            "--workflow", "inference", "--out", str(out),
        ],
        check=True,
    )
    python_blocks = oracle.rank_blocks(placements, sample, mesh)
    assert len(python_blocks) == mesh[0] * mesh[1]
    for rank, ours in enumerate(python_blocks):
        rust = load_file(str(out / f"rank-{rank}.safetensors"))
        assert sorted(rust) == sorted(ours), f"rank {rank}: different features"
        for name, block in ours.items():
            assert_same_bytes(block, rust[name], f"rank {rank} {name}")


def assert_same_bytes(want: torch.Tensor, got: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    a = want.contiguous().view(torch.uint8) if want.dtype != torch.bool else want
    b = got.contiguous().view(torch.uint8) if got.dtype != torch.bool else got
    assert torch.equal(a, b), f"{what}: bytes differ"


@pytest.mark.parametrize("mesh", [(1, 1), (2, 2), (3, 3), (2, 3)])
def test_real_samples_give_byte_identical_blocks_in_rust_and_python(
    placements: ModuleType, tmp_path: Path, mesh: tuple[int, int]
) -> None:
    for name, sample in zip(REAL_NAMES, real_samples()):
        out = tmp_path / name.replace("/", "_")
        subprocess.run(
            [
                str(featshard_bin()), "shard", str(ROOT / "examples" / "boltz2.yaml"), "--encoding", "dense",
                "--features", str(REAL / f"{name}.safetensors"), "--mesh", f"{mesh[0]}x{mesh[1]}",
                "--workflow", "inference", "--out", str(out),
            ],
            check=True,
        )
        for rank, ours in enumerate(oracle.rank_blocks(placements, sample, mesh)):
            rust = load_file(str(out / f"rank-{rank}.safetensors"))
            assert sorted(rust) == sorted(ours), f"{name} rank {rank}: different features"
            for feature, block in ours.items():
                assert_same_bytes(block, rust[feature], f"{name} rank {rank} {feature}")


@pytest.mark.parametrize("mesh", [(2, 2), (2, 3)])
def test_compact_rank_files_hold_the_packages_compact_blocks(tmp_path: Path, mesh: tuple[int, int]) -> None:
    """`featshard shard`'s compact rank files (the default encoding) hold, byte for byte,
    the compact blocks the package sends: one-hot indices and mask bits alike."""
    import featshard
    from featshard import blocks

    plan = featshard.Plan(ROOT / "examples" / "boltz2.yaml")
    for name, sample in zip(REAL_NAMES, real_samples()):
        out = tmp_path / name.replace("/", "_")
        subprocess.run(
            [str(featshard_bin()), "shard", str(ROOT / "examples" / "boltz2.yaml"), "--features",
             str(REAL / f"{name}.safetensors"), "--mesh", f"{mesh[0]}x{mesh[1]}", "--workflow", "inference",
             "--out", str(out)],
            check=True,
        )
        placed = blocks.place(plan, sample, mesh, workflow="inference")
        wire = placed.wire(compact=True)
        for rank in range(mesh[0] * mesh[1]):
            views = blocks.buffer_views(placed.rank_buffer(featshard.coords(mesh, rank), compact=True), wire)
            rust = load_file(str(out / f"rank-{rank}.safetensors"))
            for feature, block in views.items():
                assert_same_bytes(block, rust[feature], f"{name} rank {rank} {feature}")


def test_a_compact_block_read_back_is_checked_by_the_executor(tmp_path: Path) -> None:
    """The pre-sharded reader hands each compact block to the executor's check before
    expanding it, on the host or with torch on a device: a stored index that names no
    class is refused by name."""
    import featshard
    from featshard.data import _dense

    plan = featshard.Plan(ROOT / "examples" / "boltz2.yaml")
    out = tmp_path / "shards"
    subprocess.run(
        [str(featshard_bin()), "shard", str(ROOT / "examples" / "boltz2.yaml"), "--features",
         str(REAL / "prot60_smiles.safetensors"), "--mesh", "2x2", "--workflow", "inference", "--out", str(out)],
        check=True,
    )
    manifest = plan._native.shard_folder(str(out))
    path = out / "rank-0.safetensors"
    # Expanded by torch on a device (as on a CUDA mesh; here the host) or by the
    # executor: the same bytes, for every form the file holds.
    every = {k: x for k, x in load_file(str(path)).items() if manifest.stored_slot(k) is not None}
    assert {manifest.stored_slot(k).form for k in every} == {"one_hot", "bits", "sparse", "narrow"}
    by_torch = _dense(manifest, every, path, torch.device("cpu"))
    for name, x in _dense(manifest, every, path).items():
        y = by_torch[name]
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
    for device in (None, torch.device("cpu")):
        stored = load_file(str(path))["res_type"].clone()
        assert _dense(manifest, {"res_type": stored}, path, device)["res_type"].shape[-1] == 33
        stored[0] = 200
        with pytest.raises(ValueError, match=r"feature `res_type`: a stored index 200 names no class of 33"):
            _dense(manifest, {"res_type": stored}, path, device)
        # A sparse block's entry past its block, and a narrowed id past its range.
        entries = load_file(str(path))["type_bonds"].clone()
        assert entries.shape[0] > 0 and entries.shape[1] == 2
        entries[0, 0] = 10**6
        with pytest.raises(ValueError, match=r"feature `type_bonds`: stored entry 0: position 1000000 lies outside"):
            _dense(manifest, {"type_bonds": entries}, path, device)
        msa = load_file(str(path))["msa"].clone()
        assert msa.dtype == torch.uint8
        msa[0, 0] = 40
        with pytest.raises(ValueError, match=r"feature `msa`: its values lie in `range: \[0, 32\]`, found 40 at \[0, 0\]"):
            _dense(manifest, {"msa": msa}, path, device)
