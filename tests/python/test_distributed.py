"""The generated data module on real torch.distributed: gloo ranks in separate processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import start_ranks

HERE = Path(__file__).resolve().parent



def _worker(rank: int, world: int, store: str, gen_dir: str, shape: tuple[int, ...],
            scenario: str, results: str, device: str) -> None:
    sys.path[:0] = [gen_dir, str(HERE)]
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    # On a CUDA mesh too: ranks share the GPUs a test machine has (often one), and gloo
    # carries the mesh's collectives on CUDA tensors (NCCL takes one rank per GPU).
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    names = ("dp", "cp_axis_0", "cp_axis_1") if len(shape) == 3 else ("cp_axis_0", "cp_axis_1")
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    mesh = init_device_mesh(device, shape, mesh_dim_names=names)
    import boltz2_placements as P
    import boltz2_placements_data as D
    from boltz_samples import random_sample, real_samples

    host = mesh if device == "cpu" else D.cpu_mesh_like(mesh)

    coord = mesh.get_coordinate()
    assert coord is not None
    dp = coord[0] if len(shape) == 3 else 0
    cp = (shape[-2], shape[-1])
    i, j = coord[-2], coord[-1]
    source = i == 0 and j == 0
    sample = random_sample(P, 11 + dp, seed=100 + dp)
    out: dict[str, Any] = {"rank": rank}
    try:
        if scenario == "parity":
            # Passed-through values ride slots of their own: a tensor, and a value that is
            # not one (pickled), the same on every rank.
            record = {"id": f"replica-{dp}", "chains": [("A", 60), ("B", 2)]}
            carried = dict(sample, record=record, affinity_mw=torch.tensor([412.5 + dp]))
            got = D.distribute_features(carried if source else None, mesh, workflow="inference")
            assert got.pop("record") == record
            assert torch.equal(got.pop("affinity_mw"), torch.tensor([412.5 + dp]))
            _check_parity(P, D, got, sample, cp, (i, j))
        elif scenario == "collate":
            _check_collate(P, D, mesh, dp, cp, source, rank)
        elif scenario == "real":
            for real in real_samples():
                got = _on_host(D.distribute_features(real if source else None, mesh, workflow="inference"),
                               mesh, host)
                _check_parity(P, D, got, real, cp, (i, j))
                _check_remapped_ids(P, got, real)
        elif scenario == "real_collate":
            _check_real_collate(P, D, mesh, host, dp, source)
        elif scenario == "collate_mismatch":
            # Replica 1's sample lacks an optional feature replica 0's has.
            real = real_samples()[[3, 1][dp]]
            D.collate([D.distribute_features(real if source else None, mesh, workflow="inference")], mesh)
        elif scenario == "predict":
            _check_predict(P, D, mesh)
        elif scenario == "presharded":
            _check_presharded(P, D, mesh, Path(results).parent / "sharded_data", len(shape) == 3)
        elif scenario == "presharded_edited":
            _check_presharded_edited(D, mesh, Path(results).parent)
        elif scenario == "lightning":
            _check_lightning(P, D, mesh)
        elif scenario == "dataset":
            _check_dataset(D, mesh, source, rank)
        elif scenario == "source_error":
            bad = dict(sample, ref_pos=sample["ref_pos"].double())
            D.distribute_features(bad if source else None, mesh, workflow="inference")
        elif scenario == "replica_error":
            # Only DP replica 1's sample is bad: replica 0's ranks raise its error too.
            bad = dict(sample, ref_pos=sample["ref_pos"].double()) if dp == 1 else sample
            D.distribute_features(bad if source else None, mesh, workflow="inference")
        elif scenario == "value_error":
            msa = sample["msa"].clone()
            msa[0, 5] = 40  # past the 33 residue ids `range: [0, 32]` declares
            D.distribute_features(dict(sample, msa=msa) if source else None, mesh, workflow="inference")
        elif scenario == "write_error":
            # The source fails to write the second rank's buffer, after every header.
            from featshard import blocks

            made, calls = blocks.Placement.rank_buffer, []

            def failing(self: Any, *args: Any, **kwargs: Any) -> Any:
                calls.append(1)
                if len(calls) == 2:
                    raise MemoryError("no room for a rank's buffer")
                return made(self, *args, **kwargs)
            blocks.Placement.rank_buffer = failing  # type: ignore[method-assign]
            D.distribute_features(sample if source else None, mesh, workflow="inference")
        elif scenario == "rank_error":
            def check(local: Any) -> None:
                if rank == 3:
                    raise ValueError("rank 3 rejects its blocks")
            D.distribute_features(sample if source else None, mesh, workflow="inference", check=check)
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported to the test process
        out["status"] = "error"
        out["error"] = f"{type(e).__name__}: {e}"
    Path(results, f"rank-{rank}.json").write_text(json.dumps(out))
    # Nobody tears down gloo while a peer may still be using its connections.
    dist.barrier()
    dist.destroy_process_group()
    del torch


def _on_host(got: dict[str, Any], mesh: Any, host: Any) -> dict[str, Any]:
    """What a CUDA mesh received, each block checked to be on its GPU, rebuilt on the same
    mesh on the CPU for the checks (their oracle is on the CPU): the blocks unchanged."""
    from torch.distributed.tensor import DTensor

    if host is mesh:
        return got
    out = dict(got)
    for name, x in got.items():
        if isinstance(x, DTensor):
            local = x.to_local()
            assert x.device_mesh is mesh and local.device.type == mesh.device_type, f"{name}: on {local.device}"
            out[name] = DTensor.from_local(local.cpu(), host, x.placements, run_check=False,
                                           shape=x.shape, stride=x.stride())
    return out


def _check_parity(P: Any, D: Any, got: dict[str, Any], sample: dict[str, Any],
                  cp: tuple[int, int], coord: tuple[int, int]) -> None:
    import oracle
    import torch
    from torch.distributed.tensor import DTensor

    expected = oracle.rank_blocks(P, sample, cp)[coord[0] * cp[1] + coord[1]]
    taken = oracle.intake(P, sample)
    padded = oracle.pad_features(P, sample, cp)
    lay = oracle.layouts(P, sample, cp)
    assert sorted(n for n in got if isinstance(got[n], DTensor)) == sorted(expected)
    for name in sorted(expected):
        dt = got[name]
        assert tuple(dt.placements) == P.PLACEMENTS[name], name
        local = dt.to_local()
        assert torch.equal(local, expected[name]), f"{name}: received block differs"
        splits = P.SPLITS[name]
        for d, s in enumerate(splits):
            if s is not None and s[0] == "mesh" and cp[s[1]] > 1 and dt.shape[d] > 0:
                assert local.shape[d] < dt.shape[d], f"{name}: axis {d} not sharded"
        if cp == (1, 1):
            assert tuple(local.shape) == tuple(dt.shape), name
        full = dt.full_tensor()
        want = padded[name]
        follows = [(d, s[1]) for d, s in enumerate(splits) if s is not None and s[0] == "follows"]
        for d, m in follows:
            lead = next(k for k, s in enumerate(splits) if s == ("mesh", m))
            n_lead, n_follow = want.shape[lead] // cp[m], want.shape[d] // cp[m]
            want = torch.cat([want.narrow(lead, c * n_lead, n_lead).narrow(d, c * n_follow, n_follow)
                              for c in range(cp[m])], dim=lead)
        assert torch.equal(full, want), f"{name}: full_tensor differs from the padded sample"
        if name in P.MASKS:
            assert int(full.ne(0).sum()) == int(taken[name].ne(0).sum()), f"{name}: pads not masked"
    # atom_to_token by meaning: argmax per row + shard offset = the serial owner token.
    a2t = got["atom_to_token"].full_tensor()
    owner = taken["atom_to_token"].argmax(dim=1).tolist()
    positions = lay["atoms"].positions.tolist()
    a_loc = a2t.shape[0] // cp[0]
    for atom, p in enumerate(positions):
        shard = p // a_loc
        assert int(a2t[p].argmax()) + shard * a2t.shape[1] == owner[atom], f"atom {atom}"


def _check_remapped_ids(P: Any, got: dict[str, Any], sample: dict[str, Any]) -> None:
    """Every padded-global atom id (frames, constraint lists) points at the same atom as in
    the serial sample: the atom at the new position has the same reference position."""
    import oracle
    import torch

    taken = oracle.intake(P, sample)
    ref = got["ref_pos"].full_tensor()
    checked = 0
    for name, role in P.INDEX_FEATURES.items():
        if role.scope != "padded_global" or role.one_hot is not None or name not in taken:
            continue
        serial = taken[name]
        moved = got[name].full_tensor()[tuple(slice(0, n) for n in serial.shape)]
        assert torch.equal(ref[moved.flatten()], taken["ref_pos"][serial.flatten()]), name
        checked += serial.numel()
    assert checked > 0


def _check_real_collate(P: Any, D: Any, mesh: Any, host: Any, dp: int, source: bool) -> None:
    """Two DP replicas with different real samples: collate pads every list with -1
    (never an id), and every id still points at the same atom after the re-pad."""
    import oracle
    import torch
    from boltz_samples import real_samples

    sample = real_samples()[[1, 0][dp]]  # prot60_smiles (78 bounds), prot60_nomsa (0)
    batch = [D.distribute_features(sample if source else None, mesh, workflow="inference")]
    out = _on_host(D.collate(batch, mesh), mesh, host)
    taken = oracle.intake(P, sample)
    ref = out["ref_pos"].full_tensor()[dp]
    for name, role in P.INDEX_FEATURES.items():
        if role.scope != "padded_global" or role.one_hot is not None or name not in taken:
            continue
        x = out[name].full_tensor()[dp]
        if name != "frames_idx":
            k = taken[name].shape[-1]
            assert bool((x[..., k:] == -1).all()), f"{name}: collate pads are not -1"
            assert bool((x[..., :k] >= 0).all()), name
            assert torch.equal(ref[x[..., :k].flatten()], taken["ref_pos"][taken[name].flatten()]), name
    bounds = out["rdkit_bounds_index"].full_tensor()
    assert bounds.shape[-1] == 78, "the longer replica's list length"


def _check_predict(P: Any, D: Any, mesh: Any) -> None:
    """Lightning's predict loop over real samples, as Boltz's predict datamodule runs it:
    each batch reaches the model on the model's mesh with a batch axis of 1."""
    import lightning.pytorch as pl
    import torch
    import torch.distributed as dist
    from boltz_samples import real_samples
    from torch.distributed.tensor import DTensor

    samples = real_samples()[:2]

    class Serial:
        def __len__(self) -> int:
            return len(samples)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return samples[i]

    class Model(pl.LightningModule):
        def predict_step(self, batch: dict[str, Any], batch_idx: int) -> int:
            m = batch["token_pad_mask"]
            assert isinstance(m, DTensor) and m.device_mesh is mesh
            assert m.shape[0] == 1 and tuple(m.placements) == P.PLACEMENTS_DP["token_pad_mask"][1:]
            pair = batch["token_pair_pad_mask"]
            assert pair.shape[0] == 1 and pair.to_local().shape[1] < pair.shape[1]
            return int(m.full_tensor().sum())

    dm = D.lightning_datamodule(mesh, predict=Serial(), workflow="inference")
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    out = trainer.predict(Model(), datamodule=dm)
    assert out == [60, 73], out
    # The data moved over the gloo groups the pipeline made, not over the default group.
    from featshard.distribute import cp_group

    assert dist.get_backend(cp_group(D.plan(), mesh)[0]) == "gloo"
    del torch


def _check_presharded(P: Any, D: Any, mesh: Any, root: Path, dp: bool) -> None:
    """Each rank reads only its own rank files of pre-sharded real samples: the same
    DTensors (local block, placements, shape, stride) as the online path, collated too."""
    import torch
    import torch.distributed as dist
    from boltz_samples import real_samples
    from torch.distributed.tensor import DTensor

    samples = real_samples()  # sharded as s0..s3, in this order
    ds = D.PreshardedDataset(root, mesh)
    assert len(ds) == len(samples)
    coord = mesh.get_coordinate()
    source = coord[-2] == 0 and coord[-1] == 0
    indices = list(D.dp_sampler(ds, mesh, shuffle=False))
    offline = [ds[i] for i in indices]
    online = [D.distribute_features(samples[i] if source else None, mesh, workflow="inference") for i in indices]
    if dp:
        # One sample a step: step k stacks both replicas' k-th samples (the pypi ones,
        # then the Boltz-CP ones: the same features within a step).
        offline = [D.collate([x], mesh) for x in offline]
        online = [D.collate([x], mesh) for x in online]
    for a, b in zip(offline, online):
        tensors = sorted(n for n in b if isinstance(b[n], DTensor))
        assert sorted(n for n in a if isinstance(a[n], DTensor)) == tensors
        for n in tensors:
            x, y = a[n], b[n]
            assert tuple(x.placements) == tuple(y.placements), n
            assert x.shape == y.shape and x.stride() == y.stride(), n
            assert x.to_local().device.type == mesh.device_type, f"{n}: read onto {x.to_local().device}"
            assert torch.equal(x.to_local(), y.to_local()), f"{n}: blocks differ"
    if dp:
        return
    # The Lightning data module reads a pre-sharded dataset as it is: the same DTensors.
    via = list(D.lightning_datamodule(mesh, predict=ds, workflow="inference").predict_dataloader())
    assert len(via) == len(offline)
    for a, b in zip(via, offline):
        tensors = sorted(n for n in b if isinstance(b[n], DTensor))
        assert sorted(n for n in a if isinstance(a[n], DTensor)) == tensors
        for n in tensors:
            assert a[n].shape == b[n].shape and torch.equal(a[n].to_local(), b[n].to_local()), n
    # Refused: a folder sharded for another mesh, and a rank file that is another rank's.
    try:
        D.PreshardedDataset(root.parent / "sharded_2x2", mesh)
    except ValueError as e:
        assert "sharded for mesh 2x2 (cp_axis_0, cp_axis_1), this mesh is" in str(e), str(e)
    else:
        raise AssertionError("a folder of another mesh was read")
    swapped = D.PreshardedDataset(root.parent / "swapped", mesh)
    try:
        swapped[0]
    except ValueError as e:
        assert ds.rank == 1 and "not rank 1" in str(e), str(e)
    else:
        assert ds.rank != 1, "rank 1 read rank 0's file"
    flipped = D.PreshardedDataset(root.parent / "flipped", mesh)
    try:
        flipped[0]
    except ValueError as e:
        assert ds.rank == 2 and "CRC-32" in str(e), str(e)
    else:
        assert ds.rank != 2, "rank 2 read a corrupted file"
    del dist


def _check_presharded_edited(D: Any, mesh: Any, root: Path) -> None:
    """Rank files edited after the run, their checksums recomputed: each refused by
    name, as ``assemble`` refuses them (before, the reader built DTensors over them)."""
    for folder, message in [
        ("missing", "feature `res_type`: in the manifest, not in the rank file"),
        ("extra", "holds `smuggled`, which the manifest does not list"),
        ("forged", "feature `affinity_token_mask`: the rank file holds [10] uint8, the manifest says [73] float32"),
    ]:
        try:
            D.PreshardedDataset(root / folder, mesh)[0]
        except ValueError as e:
            assert "rank-0.safetensors" in str(e) and message in str(e), str(e)
        else:
            raise AssertionError(f"{folder}: an edited rank file was read")


def _check_collate(P: Any, D: Any, mesh: Any, dp: int, cp: tuple[int, int], source: bool,
                   rank: int) -> None:
    import torch
    import torch.distributed as dist
    from boltz_samples import random_sample

    sizes = [(9, 12), (14, 10)][dp]
    samples = [random_sample(P, n, seed=10 * dp + b) for b, n in enumerate(sizes)]
    batch = [D.distribute_features(s if source else None, mesh, workflow="inference") for s in samples]
    out = D.collate(batch, mesh)
    for name, x in out.items():
        if name in P.PLACEMENTS_DP:
            assert tuple(x.placements) == P.PLACEMENTS_DP[name], name
            assert x.shape[0] == 4, name
    shapes = {n: tuple(x.to_local().shape) for n, x in out.items()}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, shapes)
    assert all(s == shapes for s in everyone), "local shapes differ across ranks after collate"
    # frames_idx still points at the same atoms after the re-pad.
    ref = out["ref_pos"].full_tensor()
    frames = out["frames_idx"].full_tensor()
    n_max = out["token_index"].to_local().shape[1]
    for b, s in enumerate(samples):
        row = dp * 2 + b
        n = s["token_index"].shape[0]
        n_loc = P.padded_lengths(cp, {"tokens": n})["tokens"] // cp[0]
        for t in range(n):
            new_t = (t // n_loc) * n_max + t % n_loc
            got = ref[row][frames[row, :, new_t].flatten()]
            want = s["ref_pos"][s["frames_idx"][:, t].flatten()]
            assert torch.equal(got, want), f"sample {b} token {t}"


def _check_lightning(P: Any, D: Any, mesh: Any) -> None:
    from boltz_samples import random_sample

    class Serial:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> dict[str, Any]:
            return random_sample(P, 7 + i, seed=i)

    dm = D.lightning_datamodule(mesh, train=Serial(), val=Serial(), batch_size=1,
                               workflow="inference")
    train = dm.train_dataloader()
    assert len(train) == 2, "4 samples over 2 DP replicas"
    batch = next(iter(dm.val_dataloader()))
    # Collated where the blocks are: on the model's mesh, not a copy of it.
    assert batch["token_pad_mask"].device_mesh is mesh
    assert batch["token_pad_mask"].to_local().device.type == mesh.device_type
    # Lightning's move to the model's device leaves blocks already there where they are.
    moved = dm.transfer_batch_to_device(batch, batch["ref_pos"].to_local().device, 0)
    assert moved["ref_pos"].to_local().data_ptr() == batch["ref_pos"].to_local().data_ptr()
    assert tuple(batch["token_pad_mask"].placements) == P.PLACEMENTS_DP["token_pad_mask"]
    assert batch["ref_pos"].shape[0] == 2


def _check_dataset(D: Any, mesh: Any, source: bool, rank: int) -> None:
    import boltz2_placements as P
    from boltz_samples import random_sample

    class Serial:
        """Sample 1 cannot be read; the others can."""

        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> dict[str, Any]:
            if i == 1:
                raise OSError(f"sample {i} is corrupt")
            return random_sample(P, 8 + i, seed=i)

    with_retry = D.DistributedFeatureDataset(Serial(), mesh, retries=1, workflow="inference")
    item = with_retry[1]  # falls over to sample 2
    assert item["token_index"].shape[0] == P.padded_lengths((mesh.size(0), mesh.size(1)), {"tokens": 10})["tokens"]
    no_retry = D.DistributedFeatureDataset(Serial(), mesh, retries=0, workflow="inference")
    try:
        no_retry[1]
    except OSError as e:
        assert str(e) == "sample 1 is corrupt", str(e)
    else:
        raise AssertionError("a failed fetch was not raised on every rank")
    sampler = D.dp_sampler(with_retry, mesh, shuffle=False)
    assert list(sampler) == [0, 1, 2]
    assert D.cpu_mesh_like(mesh).mesh.tolist() == mesh.mesh.tolist()


def _run(gen_dir: Path, shape: tuple[int, ...], scenario: str, tmp: Path,
         device: str = "cpu") -> list[dict[str, Any]]:
    world = 1
    for n in shape:
        world *= n
    results = tmp / scenario
    results.mkdir()
    # The rendezvous is a file: no port to race for.
    start_ranks(_worker, (world, str(results / "store"), str(gen_dir), shape, scenario, str(results), device),
                world)
    return [json.loads((results / f"rank-{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("shape", [(3, 3), (2, 2, 2), (2, 3), (1, 1)],
                         ids=["cp3x3", "dp2xcp2x2", "cp2x3", "cp1x1"])
def test_every_rank_gets_its_block_as_a_dtensor(
    generated_dir: Path, tmp_path: Path, shape: tuple[int, ...]
) -> None:
    for r in _run(generated_dir, shape, "parity", tmp_path):
        assert r["status"] == "ok", r


@pytest.mark.parametrize("scenario", ["source_error", "value_error", "write_error", "rank_error"])
def test_an_error_on_one_rank_is_raised_on_every_rank(
    generated_dir: Path, tmp_path: Path, scenario: str
) -> None:
    results = _run(generated_dir, (2, 3), scenario, tmp_path)
    errors = {r["error"] for r in results if r["status"] == "error"}
    assert len(errors) == 1 and all(r["status"] == "error" for r in results), results
    message = errors.pop()
    if scenario == "source_error":
        assert message == "ValueError: feature `ref_pos`: expected dtype float32, got float64", message
    elif scenario == "value_error":
        assert message == "ValueError: feature `msa`: its values lie in `range: [0, 32]`, found 40 at [0, 5]", message
    elif scenario == "write_error":
        assert message == "MemoryError: no room for a rank's buffer", message
    else:
        assert message == "ValueError: rank 3 rejects its blocks", message


def test_an_error_in_one_dp_replica_is_raised_on_every_rank_of_the_world(
    generated_dir: Path, tmp_path: Path
) -> None:
    """The agreement spans the world, as the Rust distributor's does: a replica whose
    sample fails takes every other replica's ranks with it (none is left waiting in the
    next collective)."""
    results = _run(generated_dir, (2, 2, 2), "replica_error", tmp_path)
    errors = {r.get("error") for r in results}
    assert len(results) == 8 and all(r["status"] == "error" for r in results), results
    assert errors == {"ValueError: feature `ref_pos`: expected dtype float32, got float64"}, errors


def test_collate_stacks_dp_replicas_pads_to_the_dp_max_and_repads_atom_indices(
    generated_dir: Path, tmp_path: Path
) -> None:
    for r in _run(generated_dir, (2, 2, 2), "collate", tmp_path):
        assert r["status"] == "ok", r


def test_the_dataset_wrapper_retries_and_raises_fetch_errors_everywhere(
    generated_dir: Path, tmp_path: Path
) -> None:
    for r in _run(generated_dir, (2, 2), "dataset", tmp_path):
        assert r["status"] == "ok", r


def test_the_lightning_datamodule_yields_collated_dtensors(generated_dir: Path, tmp_path: Path) -> None:
    for r in _run(generated_dir, (2, 1, 2), "lightning", tmp_path):
        assert r["status"] == "ok", r


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3), (2, 3)],
                         ids=["cp1x1", "cp2x2", "cp3x3", "cp2x3"])
def test_real_featurizer_samples_distribute_unchanged(
    generated_dir: Path, tmp_path: Path, shape: tuple[int, ...]
) -> None:
    for r in _run(generated_dir, shape, "real", tmp_path):
        assert r["status"] == "ok", r


def test_real_samples_collate_over_dp_with_lists_padded_by_minus_one(
    generated_dir: Path, tmp_path: Path
) -> None:
    for r in _run(generated_dir, (2, 2, 2), "real_collate", tmp_path):
        assert r["status"] == "ok", r


def test_the_lightning_predict_loop_gives_the_model_batched_dtensors_of_real_samples(
    generated_dir: Path, tmp_path: Path
) -> None:
    for r in _run(generated_dir, (2, 2), "predict", tmp_path):
        assert r["status"] == "ok", r


def test_replicas_whose_samples_hold_different_features_fail_collate_by_name(
    generated_dir: Path, tmp_path: Path
) -> None:
    results = _run(generated_dir, (2, 2, 2), "collate_mismatch", tmp_path)
    errors = {r.get("error") for r in results}
    assert len(errors) == 1 and all(r["status"] == "error" for r in results), results
    # The Rust runtime's collate gives the same message.
    assert "DP replicas hold different features: `atom_counts_per_token` absent on some replicas" in errors.pop()


@pytest.mark.parametrize("shape", [(3, 3), (2, 2, 2)], ids=["cp3x3", "dp2xcp2x2"])
def test_presharded_samples_read_by_each_rank_equal_the_online_path(
    generated_dir: Path, tmp_path: Path, shape: tuple[int, ...]
) -> None:
    _shard_real_samples(tmp_path, shape)
    for r in _run(generated_dir, shape, "presharded", tmp_path):
        assert r["status"] == "ok", r


def test_presharded_rank_files_edited_after_the_run_are_refused_by_name(
    generated_dir: Path, tmp_path: Path
) -> None:
    """A rank file missing a feature, holding one the manifest does not list, or whose
    encoding was forged to dense, each with its identity and the manifest's CRC-32
    made to agree: the pre-sharded reader refuses each by name, as ``assemble`` does."""
    import json
    import shutil
    import subprocess
    import zlib

    import torch
    from boltz_samples import REAL
    from conftest import ROOT, featshard_bin
    from safetensors import safe_open
    from safetensors.torch import save_file

    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(REAL / "prot60_smiles.safetensors", data / "s0.safetensors")
    sharded = tmp_path / "sharded"
    subprocess.run(
        [str(featshard_bin()), "shard", str(ROOT / "examples" / "boltz2.yaml"), "--features", str(data),
         "--mesh", "1x1", "--workflow", "inference", "--out", str(sharded)],
        check=True,
    )
    for folder, message in [
        ("missing", "feature `res_type`: in the manifest, not in the rank file"),
        ("extra", "holds `smuggled`, which the manifest does not list"),
        ("forged", "feature `affinity_token_mask`: the rank file holds [10] uint8, the manifest says [73] float32"),
    ]:
        shutil.copytree(sharded, tmp_path / folder)
        rank0 = tmp_path / folder / "s0" / "rank-0.safetensors"
        manifest_path = tmp_path / folder / "s0" / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        with safe_open(str(rank0), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a mapping
        if folder == "missing":
            del tensors["res_type"]
        elif folder == "extra":
            tensors["smuggled"] = torch.zeros(3)
        else:
            identity = json.loads(meta["featshard.rank"])
            identity["encoding"] = manifest["encoding"] = "dense"
            meta["featshard.rank"] = json.dumps(identity)
        save_file(tensors, str(rank0), metadata=meta)
        raw = rank0.read_bytes()
        manifest["files"]["rank-0.safetensors"] = {"bytes": len(raw), "crc32": zlib.crc32(raw)}
        manifest_path.write_text(json.dumps(manifest))
        # `assemble` refuses it too.
        out = subprocess.run(
            [str(featshard_bin()), "assemble", str(ROOT / "examples" / "boltz2.yaml"), "--shards",
             str(tmp_path / folder / "s0"), "--out", str(tmp_path / f"{folder}.safetensors")],
            check=False, capture_output=True, text=True,
        )
        assert out.returncode == 1 and "rank-0.safetensors" in out.stderr and message in out.stderr, out.stderr
    for r in _run(generated_dir, (1, 1), "presharded_edited", tmp_path):
        assert r["status"] == "ok", r


def _shard_real_samples(tmp_path: Path, shape: tuple[int, ...]) -> None:
    """The real samples sharded into ``tmp_path/sharded_data`` for ``shape``'s CP mesh,
    and for a CP mesh the folders the refusals read: another mesh's, a rank file
    swapped, a bit flipped."""
    import shutil
    import subprocess

    from boltz_samples import REAL, REAL_NAMES
    from conftest import ROOT, featshard_bin

    data = tmp_path / "data"
    data.mkdir()
    for i, name in enumerate(REAL_NAMES):
        shutil.copy(REAL / f"{name}.safetensors", data / f"s{i}.safetensors")
    # The CP test reads compact rank files (the default), the DP one dense ones.
    encoding = "compact" if len(shape) == 2 else "dense"
    subprocess.run(
        [str(featshard_bin()), "shard", str(ROOT / "examples" / "boltz2.yaml"), "--features", str(data),
         "--mesh", f"{shape[-2]}x{shape[-1]}", "--workflow", "inference", "--encoding", encoding,
         "--out", str(tmp_path / "sharded_data")],
        check=True,
    )
    if len(shape) == 3:
        return
    subprocess.run(
        [str(featshard_bin()), "shard", str(ROOT / "examples" / "boltz2.yaml"), "--features", str(data),
         "--mesh", "2x2", "--workflow", "inference", "--out", str(tmp_path / "sharded_2x2")],
        check=True,
    )
    shutil.copytree(tmp_path / "sharded_data", tmp_path / "swapped")
    shutil.copy(tmp_path / "swapped" / "s0" / "rank-0.safetensors",
                tmp_path / "swapped" / "s0" / "rank-1.safetensors")
    # One bit flipped in rank 2's last byte of data: the manifest's CRC-32 catches it.
    shutil.copytree(tmp_path / "sharded_data", tmp_path / "flipped")
    flipped = tmp_path / "flipped" / "s0" / "rank-2.safetensors"
    raw = bytearray(flipped.read_bytes())
    raw[-1] ^= 1
    flipped.write_bytes(bytes(raw))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# The ranks share the machine's GPUs, rank r on GPU r mod their count (gloo carries the
# mesh's collectives).
@pytest.mark.skipif(not _has_cuda(), reason="no CUDA device: the CUDA mesh runs where one is")
@pytest.mark.parametrize(("scenario", "shape"), [
    ("real", (3, 3)), ("real", (2, 3)), ("real_collate", (2, 2, 2)), ("lightning", (2, 1, 2)),
    ("presharded", (3, 3)), ("presharded", (2, 2, 2)),
], ids=["real-cp3x3", "real-cp2x3", "real_collate-dp2xcp2x2", "lightning-dp2xcp1x2",
        "presharded-cp3x3", "presharded-dp2xcp2x2"])
def test_on_a_cuda_mesh_blocks_made_on_the_gpu_equal_the_host_path(
    generated_dir: Path, tmp_path: Path, scenario: str, shape: tuple[int, ...]
) -> None:
    if scenario == "presharded":
        _shard_real_samples(tmp_path, shape)
    for r in _run(generated_dir, shape, scenario, tmp_path, device="cuda"):
        assert r["status"] == "ok", r


def test_bad_loader_arguments_are_refused_where_given_naming_them() -> None:
    """A sampler seed or epoch below 0 (before: an OverflowError only at iteration),
    retries below 0 (a bare AssertionError), and a sample of an empty serial dataset (a
    ZeroDivisionError): each refused where it is given, naming the argument."""
    import featshard
    from featshard import data, lightning

    plan = featshard.Plan(HERE.parents[1] / "examples" / "boltz2.yaml")
    with pytest.raises(ValueError, match=r"dp_sampler: seed must be an integer from 0 to 2\*\*64 - 1, got -1"):
        data.DpSampler(plan, [1, 2], None, shuffle=True, seed=-1)  # type: ignore[arg-type]
    sampler = data.DpSampler.__new__(data.DpSampler)
    with pytest.raises(ValueError, match="dp_sampler: epoch must be an integer from 0 to 2\\*\\*64 - 1, got -3"):
        sampler.set_epoch(-3)
    for retries in (-1, 1.5, True):
        with pytest.raises(ValueError, match="retries: a count of further samples to try"):
            data.DistributedFeatureDataset(plan, [1], None, retries=retries)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="retries: a count"):
            lightning.lightning_datamodule(plan, None, retries=retries)  # type: ignore[arg-type]
    with pytest.raises(IndexError, match="sample index 0 is outside the serial dataset's 0 samples"):
        data.fetch_with_retries([], 0, 2)  # type: ignore[arg-type]


def test_a_batch_size_below_one_is_refused_by_the_loader_and_the_data_module() -> None:
    """``batch_size=0`` (before: the epoch came back as one batch and ``len()`` raised a
    bare ZeroDivisionError) and other non-counts, refused where given by name."""
    import featshard
    from featshard import lightning
    from featshard.loader import FeatureLoader

    plan = featshard.Plan(HERE.parents[1] / "examples" / "boltz2.yaml")
    for size in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match=f"FeatureLoader: batch_size must be an integer of at least 1, got {size!r}"):
            FeatureLoader(plan, [1], None, batch_size=size)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=f"lightning_datamodule: batch_size must be an integer of at least 1, got {size!r}"):
            lightning.lightning_datamodule(plan, None, batch_size=size)  # type: ignore[arg-type]
