"""One-axis CP meshes on gloo ranks: the shipped spec with its ``mesh:`` line changed to
``cp: [cp]``, distributed on ``(cp,)`` and ``(dp, cp)``, and the DP axis found by the
spec's name on ``(dp, cp)`` and ``(dp, cp_axis_0, cp_axis_1)``."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, featshard_bin, start_ranks

HERE = Path(__file__).resolve().parent
MODULE = "boltz2_1d_placements"


@pytest.fixture(scope="module")
def one_axis_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("one_axis")
    text = (ROOT / "examples" / "boltz2.yaml").read_text()
    # The mesh line, and a module name of its own: its ranks never import the 2-D module.
    spec = out / "boltz2_1d.yaml"
    spec.write_text(text.replace("cp: [cp_axis_0, cp_axis_1]", "cp: [cp]")
                    .replace("module: boltz2_placements", f"module: {MODULE}"))
    subprocess.run([str(featshard_bin()), "generate", str(spec), "--out", str(out), "--tests"], check=True)
    return out


def _worker(rank: int, world: int, store: str, gen_dir: str, module: str,
            shape: tuple[int, ...], names: tuple[str, ...], scenario: str, results: str) -> None:
    sys.path[:0] = [gen_dir, str(HERE)]
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    P = importlib.import_module(module)
    D = importlib.import_module(f"{module}_data")
    out: dict[str, Any] = {"rank": rank}
    try:
        if scenario == "real":
            _check_real(P, D, mesh, shape[-1])
        elif scenario == "presharded":
            _check_presharded(D, mesh, Path(results).parent / "sharded", "dp" in names)
        elif scenario == "layer":
            _check_layer(D, mesh, shape[-1])
        elif scenario == "dp":
            out.update(_dp_indices(D, mesh, names))
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test process
        out["status"] = "error"
        out["error"] = f"{type(e).__name__}: {e}"
    Path(results, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def _check_real(P: Any, D: Any, mesh: Any, cp: int) -> None:
    """Every real sample on (cp,): each rank's blocks are the executor's, and by meaning
    the DTensors are the serial sample in serial order, pads at the end of each axis."""
    import torch
    from boltz_samples import real_samples

    i = mesh.get_coordinate()[-1]
    for real in real_samples():
        got = D.distribute_features(real if i == 0 else None, mesh, workflow="inference")
        expected = D.rank_blocks(real, (cp,), workflow="inference")[i]
        for name, want in expected.items():
            dt = got[name]
            assert tuple(dt.placements) == P.PLACEMENTS[name] and len(dt.placements) == 1, name
            assert torch.equal(dt.to_local(), want), f"{name}: block differs from featshard.blocks"
        n, a = int(real["token_pad_mask"].sum()), int(real["atom_pad_mask"].sum())
        full = {k: got[k].full_tensor() for k in ("token_pad_mask", "atom_pad_mask", "ref_pos",
                                                  "atom_to_token", "token_to_rep_atom", "msa",
                                                  "token_bonds", "frames_idx")}
        N, A = full["token_pad_mask"].shape[0], full["atom_pad_mask"].shape[0]
        assert N % cp == 0 and A % cp == 0 and A % 32 == 0, (N, A)
        assert full["token_pad_mask"][:n].eq(1).all() and full["token_pad_mask"][n:].eq(0).all()
        assert full["atom_pad_mask"][:a].eq(1).all() and full["atom_pad_mask"][a:].eq(0).all()
        # Atoms in serial order (not owner blocks), padded at the end.
        assert torch.equal(full["ref_pos"][:a], real["ref_pos"][:a]) and full["ref_pos"][a:].eq(0).all()
        # Maps keep global columns: each atom's one is at its serial token.
        a2t = full["atom_to_token"]
        assert tuple(a2t.shape) == (A, N) and got["atom_to_token"].to_local().shape[1] == N
        assert torch.equal(a2t[:a, :n], real["atom_to_token"][:a, :n]) and int(a2t.sum()) == a
        t2r = full["token_to_rep_atom"]
        assert torch.equal(t2r[:n, :a], real["token_to_rep_atom"][:n, :a])
        assert int(t2r.sum()) == int(real["token_to_rep_atom"].sum())
        # MSA rows whole on every rank, tokens on cp, the gap id at the token pads.
        msa = full["msa"]
        assert got["msa"].to_local().shape[0] == msa.shape[0] == real["msa"].shape[0]
        assert torch.equal(msa[:, :n], real["msa"][:, :n]) and msa[:, n:].eq(1).all()
        # A pair feature is a row slab: rows on cp, every column.
        slab = got["token_bonds"].to_local()
        assert slab.shape[0] == N // cp and slab.shape[1] == N
        assert torch.equal(full["token_bonds"][:n, :n], real["token_bonds"][:n, :n])
        # Atom ids keep their serial values: the atoms did not move.
        assert torch.equal(full["frames_idx"][:, :n], real["frames_idx"][:, :n])


def _check_presharded(D: Any, mesh: Any, root: Path, dp: bool) -> None:
    """Real samples sharded by `featshard shard` on (cp,) (dataset mode), each rank
    reading only its own rank files: the DTensors `distribute_features` gives, collated
    over DP on (dp, cp), and through the Lightning data module on (cp,)."""
    import torch
    from boltz_samples import real_samples
    from torch.distributed.tensor import DTensor

    samples = real_samples()
    ds = D.PreshardedDataset(root, mesh)
    source = mesh.get_coordinate()[-1] == 0
    indices = list(D.dp_sampler(ds, mesh, shuffle=False))
    offline = [ds[i] for i in indices]
    online = [D.distribute_features(samples[i] if source else None, mesh, workflow="inference")
              for i in indices]
    if dp:
        offline = [D.collate([x], mesh) for x in offline]
        online = [D.collate([x], mesh) for x in online]
    else:
        via = list(D.lightning_datamodule(mesh, predict=ds, workflow="inference").predict_dataloader())
        assert len(via) == len(offline)
        online += via
        offline += offline[:]
    for a, b in zip(offline, online):
        names = sorted(n for n in b if isinstance(b[n], DTensor))
        assert sorted(n for n in a if isinstance(a[n], DTensor)) == names
        for n in names:
            x, y = a[n], b[n]
            assert tuple(x.placements) == tuple(y.placements), n
            assert x.shape == y.shape and x.stride() == y.stride(), n
            assert torch.equal(x.to_local(), y.to_local()), f"{n}: blocks differ"
            if dp:
                assert len(x.placements) == 2 and x.shape[0] == 2, n


def _layer_1d(got: dict[str, Any], pg: Any, cp: int) -> dict[str, Any]:
    """A stand-in for a one-axis model's first layers, reading its inputs as such a layer
    does: single features by rows (token columns all-gathered over cp), a pair feature as
    a row slab, the MSA with its rows whole, and ``atom_to_token`` with global token
    columns (each rank's partial atom-to-token sums reduced over cp, its own rows kept).
    The same arithmetic as :func:`_layer_serial`, on this rank's blocks."""
    import torch
    import torch.distributed as dist

    def columns(x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(cp)]
        dist.all_gather(parts, x.contiguous(), group=pg)
        return torch.cat(parts)

    res, asym = got["residue_index"].to_local(), got["asym_id"].to_local()
    rel = (res[:, None] - columns(res)[None, :]).clamp(-32, 32) * (asym[:, None] == columns(asym)[None, :])
    pair = rel.float() * got["token_pair_pad_mask"].to_local() + got["token_bonds"].to_local()[..., 0]
    rows = got["token_pad_mask"].to_local().shape[0]
    partial = got["atom_to_token"].to_local().float().T @ got["ref_pos"].to_local()
    dist.all_reduce(partial, group=pg)
    me = dist.get_rank(pg)
    token_pos = partial[me * rows:(me + 1) * rows]
    msa = got["msa"].to_local()
    profile = torch.nn.functional.one_hot(msa, 33).float().mean(0) * got["token_pad_mask"].to_local()[:, None]
    return {"pair": pair, "token_pos": token_pos, "profile": profile}


def _layer_serial(real: dict[str, Any]) -> dict[str, Any]:
    """:func:`_layer_1d` on the serial sample, its real tokens and atoms only."""
    import torch

    n, a = int(real["token_pad_mask"].sum()), int(real["atom_pad_mask"].sum())
    res, asym = real["residue_index"][:n], real["asym_id"][:n]
    rel = (res[:, None] - res[None, :]).clamp(-32, 32) * (asym[:, None] == asym[None, :])
    pair = rel.float() + real["token_bonds"][:n, :n, 0]
    token_pos = real["atom_to_token"][:a, :n].float().T @ real["ref_pos"][:a]
    profile = torch.nn.functional.one_hot(real["msa"][:, :n], 33).float().mean(0)
    return {"pair": pair, "token_pos": token_pos, "profile": profile}


def _check_layer(D: Any, mesh: Any, cp: int) -> None:
    """DTensors on (cp,) drive the one-axis stand-in to the serial result: every rank's
    rows gathered are the serial rows, and the pad rows are zero."""
    import torch
    import torch.distributed as dist
    from boltz_samples import real_samples
    from featshard.distribute import cp_group

    pg = cp_group(D.plan(), mesh)[0]
    i = mesh.get_coordinate()[0]
    for real in real_samples():
        got = D.distribute_features(real if i == 0 else None, mesh, workflow="inference")
        mine, want = _layer_1d(got, pg, cp), _layer_serial(real)
        n = int(real["token_pad_mask"].sum())
        for name, x in mine.items():
            parts = [torch.empty_like(x) for _ in range(cp)]
            dist.all_gather(parts, x.contiguous(), group=pg)
            full = torch.cat(parts)
            real_part = full[:n, :n] if name == "pair" else full[:n]
            assert torch.allclose(real_part, want[name], rtol=1e-6, atol=1e-5), name
            assert full[n:].eq(0).all() and (name != "pair" or full[:, n:].eq(0).all()), f"{name}: pads"


def _dp_indices(D: Any, mesh: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The samples this rank's sampler draws, in order and shuffled, and its DP replica."""
    dataset = list(range(7))
    ordered = list(D.dp_sampler(dataset, mesh, shuffle=False))
    shuffled = D.dp_sampler(dataset, mesh, shuffle=True, seed=3)
    shuffled.set_epoch(2)
    return {"replica": mesh.get_coordinate()[names.index("dp")], "ordered": ordered,
            "shuffled": list(shuffled)}


def _run(gen_dir: Path, module: str, shape: tuple[int, ...], names: tuple[str, ...],
         scenario: str, tmp: Path) -> list[dict[str, Any]]:
    world = 1
    for n in shape:
        world *= n
    results = tmp / scenario
    results.mkdir()
    start_ranks(_worker, (world, str(results / "store"), str(gen_dir), module, shape, names,
                          scenario, str(results)), world)
    out = [json.loads((results / f"rank-{r}.json").read_text()) for r in range(world)]
    for r in out:
        assert r["status"] == "ok", r
    return out


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_real_samples_on_a_one_axis_mesh_are_the_serial_sample_in_row_slabs(
    one_axis_dir: Path, tmp_path: Path, cp: int
) -> None:
    _run(one_axis_dir, MODULE, (cp,), ("cp",), "real", tmp_path)


def test_dtensors_on_a_one_axis_mesh_drive_a_one_axis_layer_to_the_serial_result(
    one_axis_dir: Path, tmp_path: Path
) -> None:
    _run(one_axis_dir, MODULE, (3,), ("cp",), "layer", tmp_path)


def _shard_real(tmp: Path, spec: Path, cp: int) -> None:
    """The real samples sharded into ``tmp/sharded`` on (cp,) by `featshard shard`'s
    dataset mode (compact rank files, the default)."""
    import shutil

    from boltz_samples import REAL, REAL_NAMES

    data = tmp / "data"
    data.mkdir()
    for i, name in enumerate(REAL_NAMES):
        shutil.copy(REAL / f"{name}.safetensors", data / f"s{i}.safetensors")
    subprocess.run([str(featshard_bin()), "shard", str(spec), "--features", str(data), "--mesh", str(cp),
                    "--workflow", "inference", "--out", str(tmp / "sharded")], check=True)


@pytest.mark.parametrize(("shape", "names"), [((3,), ("cp",)), ((2, 3), ("dp", "cp"))],
                         ids=["cp3", "dp2xcp3"])
def test_presharded_samples_on_a_one_axis_mesh_equal_the_online_path(
    one_axis_dir: Path, tmp_path: Path, shape: tuple[int, ...], names: tuple[str, ...]
) -> None:
    _shard_real(tmp_path, one_axis_dir / "boltz2_1d.yaml", shape[-1])
    _run(one_axis_dir, MODULE, shape, names, "presharded", tmp_path)


def test_real_samples_on_dp2_cp3(one_axis_dir: Path, tmp_path: Path) -> None:
    _run(one_axis_dir, MODULE, (2, 3), ("dp", "cp"), "real", tmp_path)


def _assert_replicas_split(results: list[dict[str, Any]], replicas: int, n: int) -> None:
    for key in ("ordered", "shuffled"):
        by_replica: dict[int, list[int]] = {}
        for r in results:
            # Every rank of one CP group draws the same samples.
            assert by_replica.setdefault(r["replica"], r[key]) == r[key], (key, results)
        assert sorted(by_replica) == list(range(replicas)), (key, by_replica)
        drawn = list(by_replica.values())
        # Replicas draw different samples, and together every one.
        assert len({tuple(d) for d in drawn}) == replicas, (key, drawn)
        assert set().union(*map(set, drawn)) == set(range(n)), (key, drawn)


@pytest.mark.parametrize(("shape", "names"), [((2, 3), ("dp", "cp")), ((3, 2), ("dp", "cp"))],
                         ids=["dp2xcp3", "dp3xcp2"])
def test_dp_replicas_of_a_one_axis_mesh_draw_different_samples(
    one_axis_dir: Path, tmp_path: Path, shape: tuple[int, ...], names: tuple[str, ...]
) -> None:
    results = _run(one_axis_dir, MODULE, shape, names, "dp", tmp_path)
    _assert_replicas_split(results, shape[0], 7)


def test_dp_replicas_of_a_tile_mesh_draw_different_samples(generated_dir: Path, tmp_path: Path) -> None:
    results = _run(generated_dir, "boltz2_placements", (2, 1, 2), ("dp", "cp_axis_0", "cp_axis_1"), "dp", tmp_path)
    _assert_replicas_split(results, 2, 7)


def test_a_device_mesh_named_otherwise_than_the_spec_is_refused_by_name(one_axis_dir: Path) -> None:
    import featshard

    plan = featshard.Plan(one_axis_dir / "boltz2_1d.yaml")
    assert plan.mesh_dims(["dp", "cp"], 2) == (0, [1])
    assert plan.mesh_dims(["cp"], 1) == (None, [0])
    with pytest.raises(ValueError, match=r"dimension `cp0` is not an axis of the spec's mesh \(dp, cp\)"):
        plan.mesh_dims(["dp", "cp0"], 2)
    with pytest.raises(ValueError, match="without names"):
        plan.mesh_dims(None, 2)
    with pytest.raises(ValueError, match=r"sizes \[2, 2\] for the spec's mesh \(cp\): one size per axis \(`2`\)"):
        plan.pad_multiple("tokens", (2, 2))


def test_the_generated_parity_test_of_a_one_axis_spec_passes(one_axis_dir: Path) -> None:
    test = one_axis_dir / f"test_{MODULE}_parity.py"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
                       capture_output=True, text=True, cwd=one_axis_dir, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "4 passed" in r.stdout, r.stdout[-2000:]
