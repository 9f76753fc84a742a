"""The generated Python module under real torch: tables, padding, lint and types."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from boltz_samples import random_sample
from conftest import ROOT, MypyStrict, featshard_bin, tool
from torch.distributed.tensor import Replicate, Shard

MESHES = [(1, 1), (2, 2), (3, 3), (2, 3), (4, 1)]


def test_every_placement_is_a_tuple_of_shard_or_replicate_per_mesh_axis(placements: ModuleType) -> None:
    assert placements.PLACEMENTS, "no placements generated"
    for name, p in placements.PLACEMENTS.items():
        assert isinstance(p, tuple) and len(p) == 2, name
        assert all(isinstance(x, (Shard, Replicate)) for x in p), name
        ndim = len(placements.FEATURE_AXIS_SEMANTICS[name])
        assert all(x.dim < ndim for x in p if isinstance(x, Shard)), name


def test_dp_placements_prepend_shard0_and_shift_every_shard(placements: ModuleType) -> None:
    for name, cp in placements.PLACEMENTS.items():
        dp = placements.PLACEMENTS_DP[name]
        assert len(dp) == 3 and dp[0] == Shard(0), name
        for a, b in zip(cp, dp[1:]):
            if isinstance(a, Shard):
                assert b == Shard(a.dim + 1), name
            else:
                assert b == Replicate(), name


def test_placements_follow_the_axis_semantics(placements: ModuleType) -> None:
    p = placements.PLACEMENTS
    assert p["res_type"] == (Shard(0), Replicate())  # [N, C]
    assert p["ref_pos"] == (Shard(0), Replicate())  # [A, C]
    assert p["token_bonds"] == (Shard(0), Shard(1))  # [N, N, C]
    assert p["coords"] == (Shard(1), Replicate())  # [E, A, C]
    assert p["atom_to_token"] == (Shard(0), Replicate())  # co-sharded [A, N]
    assert p["msa"] == (Shard(0), Shard(1))  # [S, N]
    assert p["template_frame_rot"] == (Shard(1), Replicate())  # [T, N, 3, 3]
    assert placements.FEATURE_AXIS_SEMANTICS["atom_to_token"] == ("atoms", "tokens")
    assert placements.COSHARDED["atom_to_token"] == ((1, 0),)


def test_workflows_share_the_base_set(placements: ModuleType) -> None:
    w = placements.WORKFLOWS
    assert "affinity_token_mask" in w["inference"] and "affinity_token_mask" not in w["training"]
    assert "temp_feature" in w["training"] and "temp_feature" not in w["inference"]
    assert w["inference"] & w["training"] >= {"token_index", "ref_pos", "msa", "atom_to_token"}


def reference_positions(counts: list[int], n_padded_owners: int, blocks: int) -> tuple[list[int], int]:
    """Independent statement of the owner-block rule: position of every item, block size."""
    per = n_padded_owners // blocks
    block_counts = [0] * blocks
    for owner, c in enumerate(counts):
        block_counts[owner // per] += c
    size = max(block_counts)
    filled = [0] * blocks
    positions = []
    for owner, c in enumerate(counts):
        b = owner // per
        for _ in range(c):
            positions.append(b * size + filled[b])
            filled[b] += 1
    return positions, size


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("n_tokens", [1, 7, 12])
def test_pad_features_gives_the_planned_shapes_and_pad_values(
    placements: ModuleType, mesh: tuple[int, int], n_tokens: int
) -> None:
    sample = random_sample(placements, n_tokens, seed=n_tokens * 31 + mesh[0] * 7 + mesh[1])
    out = placements.pad_features(sample, mesh, workflow="inference")
    assert set(out) == set(sample) | set(placements.DERIVED)

    blocks = math.lcm(*mesh)  # tokens and atoms are sharded on both mesh axes
    n_pad = -(-n_tokens // blocks) * blocks
    counts = [int(c) for c in sample["atom_counts_per_token"]]
    atom_pos, atoms_per_block = reference_positions(counts, n_pad, blocks)
    a_pad = blocks * atoms_per_block
    first_atom = [sum(counts[:t]) for t in range(n_tokens)]
    r_owner = [int(torch.nonzero(row)[0]) for row in sample["r_set_to_rep_atom"]]
    token_of_atom = [t for t in range(n_tokens) for _ in range(counts[t])]
    rset_pos, r_per_block = reference_positions(
        [sum(1 for a in r_owner if token_of_atom[a] == t) for t in range(n_tokens)], n_pad, blocks
    )
    padded = {"tokens": n_pad, "atoms": a_pad, "rset": blocks * r_per_block, "msa": -(-5 // mesh[0]) * mesh[0],
              "ensemble": 2, "disto_ensemble": 1, "templates": 2}
    positions = {"tokens": list(range(n_tokens)), "atoms": atom_pos, "rset": rset_pos,
                 "msa": list(range(5)), "ensemble": [0, 1], "disto_ensemble": [0], "templates": [0, 1]}
    # Unsharded lists are never padded: each keeps its own length.
    for name, x in sample.items():
        for s, n in zip(placements.FEATURE_AXIS_SEMANTICS[name], x.shape):
            if s is not None and s not in padded:
                padded[s], positions[s] = int(n), list(range(int(n)))
    _ = first_atom

    for name, x in sample.items():
        y = out[name]
        axes = placements.FEATURE_AXIS_SEMANTICS[name]
        want = [padded[s] if s is not None else int(c) for s, c in zip(axes, placements.CHANNEL_SIZES[name])]
        assert list(y.shape) == want, f"{name}: {list(y.shape)} != planned {want}"
        assert y.dtype == x.dtype, name
        # Real values sit at their layout positions; everything else is the pad value.
        index = tuple(
            torch.tensor(positions[s], dtype=torch.long).view([-1 if i == d else 1 for i in range(len(axes))])
            if s is not None else torch.arange(int(c)).view([-1 if i == d else 1 for i in range(len(axes))])
            for d, (s, c) in enumerate(zip(axes, placements.CHANNEL_SIZES[name]))
        )
        expected = x
        role = placements.INDEX_FEATURES.get(name)
        if role is not None and role.scope == "padded_global" and role.one_hot is None:
            expected = torch.tensor(atom_pos, dtype=torch.int64)[x]
        assert torch.equal(y[index], expected), f"{name}: real values misplaced"
        pad_mask = torch.ones(y.shape, dtype=torch.bool)
        pad_mask[index] = False
        pad = torch.tensor(placements.PAD_VALUES[name], dtype=y.dtype)
        assert bool((y[pad_mask] == pad).all()), f"{name}: pads are not {pad}"
    # Masks are zero at pads, msa pads with its gap id.
    assert float(out["token_pad_mask"][n_tokens:].abs().sum()) == 0.0
    if n_pad > n_tokens:
        assert bool((out["msa"][:, n_tokens:] == 1).all())


def test_padded_lengths_match_pad_features(placements: ModuleType) -> None:
    sample = random_sample(placements, 10, seed=5)
    for mesh in MESHES:
        out = placements.pad_features(sample, mesh, workflow="inference")
        got = placements.padded_lengths(
            mesh, {"tokens": 10, "atoms": int(sample["atom_counts_per_token"].sum())},
            {"atoms": sample["atom_counts_per_token"]},
        )
        assert got["tokens"] == out["token_index"].shape[0]
        assert got["atoms"] == out["ref_pos"].shape[0]


def test_bad_samples_raise_errors_naming_the_feature(placements: ModuleType) -> None:
    sample = random_sample(placements, 6, seed=1)
    bad = dict(sample, ref_pos=sample["ref_pos"][:, :2])
    with pytest.raises(ValueError, match=r"feature `ref_pos`, axis 1 \(channel\)"):
        placements.pad_features(bad, (2, 2), workflow="inference")
    bad = dict(sample, res_type=sample["res_type"][:-1])
    with pytest.raises(ValueError, match=r"feature `\w+`, axis 0 \(tokens"):
        placements.pad_features(bad, (2, 2), workflow="inference")
    with pytest.raises(ValueError, match="not in the spec: `nope`"):
        placements.pad_features(dict(sample, nope=torch.zeros(1)), (2, 2), workflow="inference")
    with pytest.raises(ValueError, match="mesh"):
        placements.pad_features(sample, (0, 2), workflow="inference")
    for value in (7.0, float("nan")):
        mask = sample["token_resolved_mask"].clone()
        mask[2] = value
        with pytest.raises(ValueError, match=r"feature `token_resolved_mask`: a mask holds 0 or 1 .* at flat index 2"):
            placements.pad_features(dict(sample, token_resolved_mask=mask), (2, 2), workflow="inference")


def test_generated_python_passes_ruff(generated_dir: Path) -> None:
    files = [str(p) for p in sorted(generated_dir.glob("*.py*"))]
    assert len(files) == 3, files
    result = subprocess.run(
        [tool("ruff"), "check", "--no-cache", *files], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "name", ["boltz2_placements.py", "boltz2_placements.pyi", "boltz2_placements_data.py"]
)
def test_generated_python_passes_mypy_strict(generated_dir: Path, name: str, mypy_strict: MypyStrict) -> None:
    result = mypy_strict(generated_dir / name, cwd=generated_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def test_example_spec_validates_against_the_json_schema() -> None:
    import jsonschema
    import yaml

    schema = json.loads(subprocess.run([str(featshard_bin()), "schema"], capture_output=True, check=True).stdout)
    spec = yaml.safe_load((ROOT / "examples" / "boltz2.yaml").read_text())
    jsonschema.validate(spec, schema)
    spec["features"]["msa"]["dtyp"] = "int64"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(spec, schema)


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_every_example_validates_against_the_schema_it_points_at(example: str) -> None:
    import jsonschema
    import yaml

    path = ROOT / "examples" / example
    first = path.read_text().splitlines()[0]
    reference = first.removeprefix("# yaml-language-server: $schema=")
    assert reference != first, f"{example} names no schema"
    schema = json.loads((path.parent / reference).read_text())
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_generate_tests_writes_a_parity_test_that_passes(tmp_path: Path, mypy_strict: MypyStrict) -> None:
    """`featshard generate --tests`: the user's own parity test, linted, typed and run."""
    out = tmp_path / "gen"
    subprocess.run(
        [str(featshard_bin()), "generate", str(ROOT / "examples" / "boltz2.yaml"),
         "--out", str(out), "--tests"],
        check=True,
    )
    test = out / "test_boltz2_placements_parity.py"
    assert test.exists()
    for r in (subprocess.run([tool("ruff"), "check", "--no-cache", str(test)],
                             capture_output=True, text=True, cwd=out, check=False),
              mypy_strict(test, cwd=out)):
        assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        capture_output=True, text=True, cwd=out, check=False,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "4 passed" in r.stdout, r.stdout[-2000:]
