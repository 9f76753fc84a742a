"""`featshard.blocks`: the package's byte executor on torch tensors (DLPack, no padded
copy) gives every rank's blocks, and the whole padded sample, byte for byte as the Python
reference (`oracle.py`) and `featshard shard` do, and refuses bad input and bad outputs
by name."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from types import ModuleType

import featshard
import oracle
import pytest
import torch
from boltz_samples import (
    as_elements,
    as_indices,
    as_narrow,
    random_sample,
    real_samples,
)
from conftest import ROOT, featshard_bin
from featshard import _native, blocks
from featshard.distribute import _local_blocks
from safetensors.torch import save_file

SPEC = ROOT / "examples" / "boltz2.yaml"
MESHES = [(1, 1), (2, 2), (3, 3), (2, 3), (4, 1)]


@pytest.fixture(scope="module")
def plan() -> featshard.Plan:
    return featshard.Plan(SPEC)


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8) if x.dtype != torch.bool else x


def assert_same_blocks(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor], what: str) -> None:
    assert sorted(want) == sorted(got), what
    for name, w in want.items():
        g = got[name]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"{what} {name}"
        assert g.is_contiguous(), f"{what} {name}"
        assert torch.equal(as_bytes(g), as_bytes(w)), f"{what} {name}: bytes differ"


def shard_refuses(sample: dict[str, torch.Tensor], tmp_path: Path) -> str:
    """`featshard shard` of `sample` on 2x2 fails and writes nothing; its stderr."""
    save_file(sample, str(tmp_path / "bad.safetensors"))
    shard = subprocess.run(
        [str(featshard_bin()), "shard", str(SPEC), "--features", str(tmp_path / "bad.safetensors"),
         "--mesh", "2x2", "--workflow", "inference", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, check=False,
    )
    assert shard.returncode != 0
    assert not (tmp_path / "out").exists()
    return shard.stderr


def assert_same_sample(want: dict[str, object], got: dict[str, object], what: str) -> None:
    """Tensors equal byte for byte; other values (metadata) passed through as they are."""
    assert sorted(want) == sorted(got), what
    tensors = [n for n, w in want.items() if isinstance(w, torch.Tensor)]
    assert all(got[n] is want[n] for n in want if n not in tensors), what
    assert_same_blocks({n: want[n] for n in tensors}, {n: got[n] for n in tensors}, what)


@pytest.mark.parametrize("mesh", MESHES, ids=[f"{a}x{b}" for a, b in MESHES])
def test_native_blocks_equal_the_generated_python_path(
    placements: ModuleType, plan: featshard.Plan, mesh: tuple[int, int]
) -> None:
    for seed in range(2):
        sample = random_sample(placements, 13 + 6 * seed, seed=seed + 10 * mesh[0] + mesh[1])
        want = oracle.rank_blocks(placements, sample, mesh)
        for threads in (1, 2):
            got = blocks.rank_blocks(plan, sample, mesh, workflow="inference", threads=threads)
            assert len(got) == len(want) == mesh[0] * mesh[1]
            for rank, (w, g) in enumerate(zip(want, got)):
                assert_same_blocks(w, g, f"seed {seed} threads {threads} rank {rank}")


def test_native_blocks_of_real_samples_equal_the_generated_python_path(
    placements: ModuleType, plan: featshard.Plan
) -> None:
    for i, sample in enumerate(real_samples()):
        for mesh in [(2, 2), (3, 3)]:
            want = oracle.rank_blocks(placements, sample, mesh)
            got = blocks.rank_blocks(plan, sample, mesh, workflow="inference", threads=2)
            for rank, (w, g) in enumerate(zip(want, got)):
                assert_same_blocks(w, g, f"real sample {i} mesh {mesh} rank {rank}")


def test_the_taken_and_padded_samples_equal_the_reference(
    placements: ModuleType, plan: featshard.Plan
) -> None:
    """`featshard.padding` (and so the generated module's `intake` and `pad_features`)
    gives the reference's taken sample, padded sample and layouts, random and real."""
    from featshard import padding

    cases = [(random_sample(placements, 9 + 5 * s, seed=40 + s), m) for s, m in enumerate(MESHES)]
    cases += [(sample, (3, 3)) for sample in real_samples()]
    for i, (sample, mesh) in enumerate(cases):
        what = f"case {i} mesh {mesh}"
        taken = padding.intake(plan, sample, workflow="inference")
        assert_same_sample(oracle.intake(placements, sample), taken, f"{what} intake")
        assert_same_sample(taken, padding.intake(plan, taken, workflow="inference"), f"{what} intake twice")
        padded = padding.pad_features(plan, sample, mesh, workflow="inference", threads=2)
        assert_same_sample(oracle.pad_features(placements, sample, mesh), padded, f"{what} padded")
        want = oracle.layouts(placements, sample, mesh)
        got = padding.layouts(plan, sample, mesh, workflow="inference")
        assert sorted(want) == sorted(got), what
        for sem, w in want.items():
            g = got[sem]
            assert (g.padded, g.per_block, g.length) == (w.padded, w.per_block, w.length), sem
            assert (g.positions is None) == (w.positions is None), sem
            assert g.positions is None or torch.equal(g.positions, w.positions), sem


def test_a_placement_reports_its_layout_and_carries_metadata(
    placements: ModuleType, plan: featshard.Plan
) -> None:
    sample = random_sample(placements, 11, seed=3)
    placed = blocks.place(plan, dict(sample, extra=[1, 2]), (2, 2), workflow="inference",
                          passthrough={"extra"})
    assert placed.passthrough["extra"] == [1, 2]
    lay = placed.layout
    assert lay.mesh == (2, 2) and lay.sizes["tokens"] == 11
    assert lay.padded["tokens"] % 2 == 0
    dtype, shape = placed.features["token_pad_mask"]
    assert dtype == sample["token_pad_mask"].dtype and shape == (lay.padded["tokens"] // 2,)
    # Every rank's buffer carries it in a slot of its own, pickled; the header says so,
    # and reads back from its bytes.
    header = _native.Header.from_bytes(placed.header(sample=4).to_bytes())
    assert header.sample == 4 and header.layout.sizes["tokens"] == 11
    slot = header.buffer.slot("extra")
    assert slot is not None and slot.encoding == "pickle" and slot.global_shape is None
    assert blocks.carried(placed.rank_buffer((1, 0)), header.buffer) == {"extra": [1, 2]}
    # A passed-through value that cannot ride (it does not pickle) is refused by name.
    lost = blocks.place(plan, dict(sample, extra=lambda: 0), (2, 2), workflow="inference",
                        passthrough={"extra"})
    with pytest.raises(ValueError, match="^feature `extra`: passed through, .* does not pickle"):
        lost.header()


def test_bad_samples_are_refused_as_featshard_shard_refuses_them(
    placements: ModuleType, plan: featshard.Plan, tmp_path: Path
) -> None:
    sample = random_sample(placements, 9, seed=5)
    bad = dict(sample, ref_pos=sample["ref_pos"].double())
    with pytest.raises(ValueError) as raised:
        blocks.place(plan, bad, (2, 2), workflow="inference")
    assert "`ref_pos`" in str(raised.value) and str(raised.value) in shard_refuses(bad, tmp_path)
    with pytest.raises(TypeError, match="feature `ref_pos`: expected a float32 tensor, got list"):
        blocks.place(plan, dict(sample, ref_pos=[0.0]), (2, 2), workflow="inference")


def test_outputs_of_the_wrong_shape_or_sharing_memory_are_refused(
    placements: ModuleType, plan: featshard.Plan
) -> None:
    sample = random_sample(placements, 9, seed=6)
    placed = blocks.place(plan, sample, (2, 2), workflow="inference")
    outs = placed.empty_blocks(["res_type"])
    with pytest.raises(ValueError, match="feature `res_type`: its block is"):
        placed.write_blocks((0, 0), {"res_type": outs["res_type"][:1].clone()})
    with pytest.raises(ValueError, match="shares memory with the sample"):
        taken = sample["res_type"]
        placed.write_blocks((0, 0), {"res_type": taken.view(-1)[: outs["res_type"].numel()]
                                     .view(outs["res_type"].shape)})
    with pytest.raises(ValueError, match="feature `nope`: not a placed feature"):
        placed.write_blocks((0, 0), {"nope": torch.zeros(1)})


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise KeyError("VmRSS")


def test_rank_buffers_outlive_their_placement_and_are_freed_with_their_blocks(
    placements: ModuleType, plan: featshard.Plan
) -> None:
    sample = random_sample(placements, 64, seed=7, msa_rows=64)
    want = oracle.rank_blocks(placements, sample, (2, 2))[3]
    placed = blocks.place(plan, sample, (2, 2), workflow="inference")
    got = placed.rank_blocks((1, 1))
    unconsumed = placed._native.rank_buffer((0, 0))  # freed by its capsule alone
    del placed, unconsumed
    assert_same_blocks(want, got, "after the placement went")
    size = sum(b.numel() * b.element_size() for b in got.values())
    del got
    base = _rss()
    for _ in range(40):
        again = blocks.rank_blocks(plan, sample, (2, 2), workflow="inference")
        del again
    # 40 rounds of 4 ranks' buffers: freed each round, so at most a few stay resident.
    assert _rss() - base < 8 * size + (32 << 20)


def test_a_tensor_resized_or_freed_after_placing_is_refused_not_read(
    placements: ModuleType, plan: featshard.Plan
) -> None:
    """Reading a placed tensor whose memory moved would read freed memory (a segfault
    at best): every read checks the tensor's storage first."""
    for name, spoil in [
        ("ref_pos", lambda t: t.resize_(1 << 20)),
        ("res_type", lambda t: t.untyped_storage().resize_(0)),
    ]:
        sample = random_sample(placements, 9, seed=8)
        sample = {n: (t.clone() if isinstance(t, torch.Tensor) else t) for n, t in sample.items()}
        placed = blocks.place(plan, sample, (2, 2), workflow="inference")
        spoil(sample[name])
        for read in (
            lambda p=placed: p.blocks_at((0, 0)),
            lambda p=placed: p.rank_blocks((1, 1)),
            lambda p=placed: p.padded(),
        ):
            with pytest.raises(ValueError, match=f"feature `{name}`: its tensor was resized"):
                read()


def test_owner_counts_whose_sum_wraps_are_refused_not_a_panic(
    placements: ModuleType, plan: featshard.Plan
) -> None:
    """int64 counts [2^63-1, 2^63-1, n+2, 0, ...] sum to n in wrapping arithmetic."""
    sample = random_sample(placements, 9, seed=9)
    counts = sample["atom_counts_per_token"]
    real = int(counts.sum())
    wrapped = torch.zeros_like(counts)
    wrapped[0], wrapped[1], wrapped[2] = 2**63 - 1, 2**63 - 1, real + 2
    with pytest.raises(ValueError, match="feature `atom_counts_per_token`.*overflow"):
        blocks.place(plan, dict(sample, atom_counts_per_token=wrapped), (2, 2), workflow="inference")
    sizes = {"tokens": 3, "atoms": 5}
    with pytest.raises(ValueError, match="semantic `atoms`: owner counts sum past"):
        plan.layout((2, 2), sizes, counts={"atoms": [2**64 - 1, 2**64 - 1, 7]})


def test_native_entry_points_refuse_bad_arguments_by_name(
    placements: ModuleType, plan: featshard.Plan
) -> None:
    """No argument reaches Rust unchecked: each is a ValueError naming it, never a
    PanicException or an answer for a rank that does not exist."""
    for call, name in [
        (lambda: _native.coords((3, 3), 9), "rank"),
        (lambda: _native.coords((2**64 - 1, 2), 0), "mesh"),
        (lambda: plan.collate_join("res_type", {"res_type": [5, 33]}, {"res_type": [3, 33]}), "collate"),
        (lambda: _native.replica_indices(2**64 - 1, 2, 0), "n"),
        (lambda: plan.layout((2, 2), {"tokens": 2**40}), "sizes"),
        (lambda: plan.layout((2, 2), {"not_a_semantic": 3}), "sizes"),
        (lambda: plan.block_window("res_type", [2**60, 33], (65535, 0), (65536, 1)), "coord"),
        (lambda: plan.block_window("res_type", [3, 33], (7, 7), (3, 3)), "coord"),
        (lambda: _native.replica_indices(10, 0, 0), "dp"),
        (lambda: plan.collate_join("res_type", {"res_type": [3, 33]}, {}), "collate"),
    ]:
        with pytest.raises(ValueError, match=f"^{name}: "):
            call()
    sample = random_sample(placements, 9, seed=11)
    placed = blocks.place(plan, sample, (3, 3), workflow="inference")
    for read in (lambda: placed.blocks_at((5, 5)), lambda: placed.rank_blocks((3, 0))):
        with pytest.raises(ValueError, match=r"^coord: \(\d, \d\) is not on mesh 3x3 \(cp_axis_0, cp_axis_1\)"):
            read()


def test_a_corrupt_plan_file_is_refused_by_name_not_a_panic(plan: featshard.Plan, tmp_path: Path) -> None:
    """A plan file edited by hand (an axis on mesh axis 5, a shard past the tensor's
    axes, an unknown semantic) is refused when read, naming the file and what is
    wrong; before, it was read and panicked (index out of bounds) at the first use."""
    import json

    good = json.loads(plan._native.json())
    for edit, want in [
        (lambda p: p["features"]["res_type"]["axes"][0]["split"].__setitem__("mesh_axis", 5),
         "feature `res_type`: axis 0: mesh axis 5"),
        (lambda p: p["features"]["res_type"]["placements"].__setitem__(0, {"shard": 9}),
         "feature `res_type`: placements"),
        (lambda p: p["semantics"]["atoms"]["padding"].__setitem__("owner", "gone"),
         "semantic `atoms`: `gone` is not a semantic"),
    ]:
        doc = json.loads(json.dumps(good))
        edit(doc)
        path = tmp_path / "edited.plan.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(ValueError) as raised:
            featshard.Plan.from_plan_file(path)
        assert str(path) in str(raised.value) and want in str(raised.value), str(raised.value)


COMPACT_MESHES = [(1, 1), (2, 2), (3, 3), (2, 3)]


@pytest.mark.parametrize("mesh", COMPACT_MESHES, ids=[f"{a}x{b}" for a, b in COMPACT_MESHES])
def test_compact_rank_buffers_expand_to_the_dense_blocks_of_real_samples(
    plan: featshard.Plan, mesh: tuple[int, int]
) -> None:
    """Every rank's buffer with one-hot features as indices, expanded, is byte for byte
    the dense rank's blocks (masks, pads and remapped ids untouched), on every real
    sample; and it is smaller."""
    for i, sample in enumerate(real_samples()):
        placed = blocks.place(plan, sample, mesh, workflow="inference")
        wire = placed.wire(compact=True)
        assert {s.name for s in wire.slots if s.form is not None} >= {"res_type", "disto_target", "ref_element"}
        for rank in range(mesh[0] * mesh[1]):
            coord = featshard.coords(mesh, rank)
            dense = placed.rank_blocks(coord)
            compact = placed.rank_buffer(coord, compact=True)
            assert compact.numel() < placed.rank_buffer(coord).numel()
            views = blocks.buffer_views(compact, wire)
            got = blocks.expand(plan, views, wire)
            assert_same_blocks(dense, got, f"real sample {i} mesh {mesh} rank {rank}")
            # What a GPU mesh runs (the buffer copied to the device, torch expanding
            # there), here on the CPU: the same blocks.
            on_device = _local_blocks(plan, compact, wire, torch.device("cpu"))
            assert_same_blocks(dense, on_device, f"torch: real sample {i} mesh {mesh} rank {rank}")


def _vector(name: str) -> tuple[blocks.Slot, torch.Tensor, bytes]:
    """The executor's expansion vector ``name``: its slot, its stored block as a tensor,
    and the dense bytes the executor makes of it."""
    from featshard import _native

    for slot, packed, dense in _native.expansion_vectors():
        if slot.name == name:
            raw = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
            return slot, raw.view(blocks.torch_dtype(slot.dtype)).view(slot.shape), dense
    raise KeyError(name)


def test_sparse_entries_past_the_last_write_nothing_and_every_element_keeps_its_bits() -> None:
    """torch's expansion of sparse entries (what a CUDA mesh runs): entries past the last
    (position -1) write nowhere in the block, even after one at position 0, and an
    element keeps its bits (-0.0 stays -0.0)."""
    slot, rows, _ = _vector("sparse_float32")
    assert int(rows[0, 0]) == 0 and int(rows[-1, 0]) == -1
    got = blocks.expand_block(rows, slot, torch.device("cpu"))
    # Elements by their bits: 3 and 1 (as the vector stores them), and -0.0.
    want = torch.zeros(12, dtype=torch.int32)
    want[0], want[5], want[11] = 3, int(torch.tensor([-0.0]).view(torch.int32)), 1
    assert got.shape == (3, 4)
    assert torch.equal(got.reshape(-1).view(torch.int32), want), got


@pytest.mark.parametrize("classes", [5, 300], ids=["from-a-table", "by-scatter"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_torch_one_hot_rows_put_a_one_at_each_class_and_none_outside_the_classes(
    classes: int, axis: int
) -> None:
    """torch's one-hot expansion (what a CUDA mesh runs), from a table of rows for few
    classes and by a scatter for many, on any axis: a 1 at each index's class, and a row
    of 0 for an index outside ``0..classes`` (-1, below it, the class count, above it);
    unsigned indices as the executor writes them (the class count for none) too."""
    index = "uint8" if classes < 256 else "int16"
    for dense_dtype in (torch.float32, torch.int64):
        name = f"one_hot_{classes}_axis{axis}_rank3_{blocks.dtype_name(dense_dtype)}"
        slot, idx, dense = _vector(name)
        assert slot.dtype == index and idx.dim() == 2
        recipe = slot.recipe
        assert recipe is not None and recipe.op == ("rows" if classes <= 256 else "scatter")
        got = blocks.expand_block(idx, slot, torch.device("cpu"))
        assert got.dtype == dense_dtype and got.is_contiguous()
        assert torch.equal(got, _one_hot_reference(idx, axis, classes).to(dense_dtype)), (idx, axis)
        assert got.view(torch.uint8).flatten().numpy().tobytes() == dense
        if index == "int16":
            assert int(idx.min()) < -1 and int(idx.max()) > classes


def _one_hot_reference(idx: torch.Tensor, axis: int, classes: int) -> torch.Tensor:
    """A 2D index tensor's one-hot block, element by element."""
    out = torch.zeros([*idx.shape[:axis], classes, *idx.shape[axis:]])
    for i in range(idx.shape[0]):
        for j in range(idx.shape[1]):
            c = int(idx[i, j])
            if 0 <= c < classes:
                out[tuple([i, j][:axis] + [c] + [i, j][axis:])] = 1
    return out


def test_compact_indices_are_the_executors_and_pads_are_no_class(plan: featshard.Plan) -> None:
    """A compact block holds each row's class (uint8 for 33 classes), and the index of no
    class (33) on pad rows; expanding it on its own gives the dense block. The 73-token
    sample pads to 74 on 2x2: rank (1, 0) holds the pad row."""
    sample = real_samples()[1]
    placed = blocks.place(plan, sample, (2, 2), workflow="inference")
    wire = placed.wire(compact=True)
    views = blocks.buffer_views(placed.rank_buffer((1, 0), compact=True), wire)
    idx = views["res_type"]
    assert idx.dtype == torch.uint8 and idx.dim() == 1
    dense = placed.rank_blocks((1, 0))["res_type"]
    want = torch.where(dense.sum(1) == 1, dense.argmax(1), 33).to(torch.uint8)
    assert torch.equal(idx, want)
    assert int((idx == 33).sum()) == int((dense.sum(1) == 0).sum()) > 0
    assert torch.equal(blocks.expand_block(idx, wire.slot("res_type"), torch.device("cpu")), dense)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda x: x["res_type"].__setitem__((3, (int(x["res_type"][3].argmax()) + 1) % 33), 1),
         "feature `res_type`, axis 1 (one-hot): a one-hot row holds one 1 (or none, a pad row), found a second 1"),
        (lambda x: x["disto_target"].__setitem__((2, 7, 0, 9), 2.0),
         "feature `disto_target`, axis 3 (one-hot): a one-hot row holds only 0 and 1, found 2 at [2, 7, 0, 9]"),
        (lambda x: x["mol_type"].__setitem__(4, -1),
         "feature `mol_type`: its values lie in `range: [0, 3]`, found -1 at [4]"),
    ],
    ids=["two_ones", "a_two", "out_of_range"],
)
def test_a_bad_one_hot_row_or_ranged_value_is_refused_as_featshard_shard_refuses_it(
    plan: featshard.Plan, tmp_path: Path, change, message: str  # type: ignore[no-untyped-def]
) -> None:
    sample = {n: x.clone() for n, x in real_samples()[0].items()}
    change(sample)
    with pytest.raises(ValueError) as raised:
        blocks.place(plan, sample, (2, 2), workflow="inference")
    assert message in str(raised.value)
    assert str(raised.value) in shard_refuses(sample, tmp_path)


def test_sparse_and_ranged_features_travel_as_entries_and_narrowed(plan: featshard.Plan) -> None:
    """A sparse feature's compact block is its nonzero entries, as many rows as the
    fullest rank's block holds (-1 past a block's last); a ranged one is its block in
    uint8. Both expand to the dense block."""
    sample = real_samples()[1]  # prot60_smiles: it has bonds
    placed = blocks.place(plan, sample, (2, 2), workflow="inference")
    wire = placed.wire(compact=True)
    dense = [placed.rank_blocks(featshard.coords((2, 2), r)) for r in range(4)]
    for name in ("token_bonds", "type_bonds", "contact_threshold"):
        nonzero = [int((d[name] != 0).sum()) for d in dense]
        slot = wire.slot(name)
        assert slot is not None and (slot.dtype, slot.shape) == ("int64", [max(nonzero), 2]), name
    assert max(int((d["type_bonds"] != 0).sum()) for d in dense) > 0
    for rank in range(4):
        coord = featshard.coords((2, 2), rank)
        views = blocks.buffer_views(placed.rank_buffer(coord, compact=True), wire)
        entries = views["type_bonds"]
        real = int((dense[rank]["type_bonds"] != 0).sum())
        assert bool((entries[:real, 0] >= 0).all()) and bool((entries[real:, 0] == -1).all())
        assert views["msa"].dtype == torch.uint8 and torch.equal(views["msa"].long(), dense[rank]["msa"])
        expanded = blocks.expand(plan, views, wire)
        names = ("token_bonds", "type_bonds", "contact_threshold", "msa", "mol_type")
        assert_same_blocks({n: dense[rank][n] for n in names}, {n: expanded[n] for n in names}, f"rank {rank}")


@pytest.mark.parametrize("mesh", COMPACT_MESHES, ids=[f"{a}x{b}" for a, b in COMPACT_MESHES])
def test_one_hot_features_given_as_indices_give_the_dense_inputs_blocks(
    plan: featshard.Plan, mesh: tuple[int, int]
) -> None:
    """A sample whose one-hot features arrive as their indices (any integer dtype), whose
    sparse features arrive as sparse COO tensors and whose masks and ranged ids arrive
    as bool and uint8 places to the same dense blocks,
    compact buffers and padded layout as the sample with them dense, on every real
    sample."""
    for i, sample in enumerate(real_samples()):
        dense = blocks.place(plan, sample, mesh, workflow="inference")
        compact_input = as_narrow(as_elements(as_indices(sample, [torch.int16, torch.int64][i % 2])))
        given = blocks.place(plan, compact_input, mesh, workflow="inference")
        assert given.features == dense.features
        for rank in range(mesh[0] * mesh[1]):
            coord = featshard.coords(mesh, rank)
            what = f"real sample {i} mesh {mesh} rank {rank}"
            assert_same_blocks(dense.rank_blocks(coord), given.rank_blocks(coord), what)
            assert torch.equal(dense.rank_buffer(coord, compact=True), given.rank_buffer(coord, compact=True)), what
        assert_same_blocks(dense.padded(), given.padded(), f"real sample {i} padded")
        assert_same_blocks(dense.serial(), given.serial(), f"real sample {i} serial")


@pytest.mark.parametrize(
    ("feature", "value", "message"),
    [("res_type", 40, "feature `res_type`, axis 1 (one-hot): given as indices, 40 names no class of 33 (-1: none) at [5]"),
     ("atom_to_token", 999, "feature `atom_to_token`, axis 1 (one-hot): given as indices, 999 names no item of the 73 `tokens` (-1: none) at [5]")],
    ids=["class", "map"],
)
def test_indices_that_name_no_class_are_refused_by_name(
    plan: featshard.Plan, tmp_path: Path, feature: str, value: int, message: str
) -> None:
    sample = as_indices(real_samples()[1])
    sample[feature][5] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        blocks.place(plan, sample, (2, 2), workflow="inference")
    assert message in shard_refuses(sample, tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [(lambda ix: ix.__setitem__((1, 0), 500),
      "feature `type_bonds`: element 0: coordinate 500 along axis 1 is outside its 73 items"),
     (lambda ix: ix.__setitem__((slice(None), 1), ix[:, 0]),
      "feature `type_bonds`: elements 0 and 1 are at the same coordinate")],
    ids=["outside", "twice"],
)
def test_sparse_elements_outside_the_feature_or_given_twice_are_refused_by_name(
    plan: featshard.Plan, tmp_path: Path, change, message: str  # type: ignore[no-untyped-def]
) -> None:
    sample = as_elements(real_samples()[1], pairs=True)
    change(sample["type_bonds.indices"])
    with pytest.raises(ValueError, match=re.escape(message)):
        blocks.place(plan, sample, (2, 2), workflow="inference")
    assert message in shard_refuses(sample, tmp_path)


def test_meta_and_sparse_tensors_are_refused_naming_the_feature(plan: featshard.Plan) -> None:
    """A meta tensor (no data) or a sparse one (for a feature not declared sparse) is
    refused naming the feature and what it is; before, torch's own message named
    neither."""
    sample = real_samples()[0]
    for value, what in [(torch.empty(sample["res_type"].shape, dtype=torch.int64, device="meta"),
                         "a meta tensor (no data)"),
                        (sample["res_type"].to_sparse(), "a sparse_coo tensor (make it dense: .to_dense())")]:
        with pytest.raises(TypeError) as raised:
            blocks.place(plan, dict(sample, res_type=value), (2, 2), workflow="inference")
        assert str(raised.value) == f"feature `res_type`: expected a int64 tensor, got {what}"


def test_a_receiver_refuses_a_compact_block_that_is_not_its_features_form(plan: featshard.Plan) -> None:
    """The executor checks every compact block it expands: an index naming no class, or
    a block of another dtype, is refused naming the feature, and nothing is expanded."""
    placed = blocks.place(plan, real_samples()[0], (2, 2), workflow="inference")
    wire = placed.wire(compact=True)
    views = blocks.buffer_views(placed.rank_buffer((0, 0), compact=True), wire)
    bad = dict(views, res_type=views["res_type"].clone().fill_(40))
    with pytest.raises(ValueError, match="`res_type`"):
        blocks.expand(plan, bad, wire)
    bad = dict(views, msa=views["msa"].to(torch.int16))
    with pytest.raises(ValueError, match="`msa`.*uint8"):
        blocks.expand(plan, bad, wire)


def test_a_freed_ranks_buffer_is_recycled_and_written_whole(plan: featshard.Plan) -> None:
    """Once every tensor viewing a rank's buffer is gone, the next buffer of about its
    size reuses its memory; every byte is written again (old bytes, gaps between blocks
    included, never show through), in the dense and the compact form and on expansion."""
    placed = blocks.place(plan, real_samples()[1], (2, 2), workflow="inference")
    for compact in (False, True):
        blocks.release_buffers()
        want = placed.rank_buffer((1, 0), compact=compact).clone()
        spoilt = placed.rank_buffer((1, 0), compact=compact).fill_(0xA5)
        at = spoilt.data_ptr()
        del spoilt
        again = placed.rank_buffer((1, 0), compact=compact)
        assert again.data_ptr() == at, "the freed buffer was not reused"
        assert torch.equal(again, want)
    wire = placed.wire(compact=True)
    views = blocks.buffer_views(placed.rank_buffer((1, 0), compact=True), wire)
    expanded = {s.name for s in wire.slots if s.form is not None}
    dense = {n: x for n, x in blocks.expand(plan, views, wire).items() if n in expanded}
    want = {n: x.clone() for n, x in dense.items()}
    for x in dense.values():
        x.fill_(1)
    at = x.untyped_storage().data_ptr()
    del dense, x
    again = blocks.expand(plan, views, wire)
    assert again[next(iter(expanded))].untyped_storage().data_ptr() == at, "not expanded into the freed buffer"
    assert_same_blocks(want, {n: again[n] for n in expanded}, "expanded into recycled memory")
    assert blocks.release_buffers() > 0


def test_narrow_input_is_checked_as_the_declared_feature(plan: featshard.Plan, tmp_path: Path) -> None:
    """Ranged ids given as uint8 are checked against the range; a mask given in a
    narrower type other than bool, or ids in a type that cannot hold the range, are
    refused by their dtype, and `featshard shard` refuses them alike."""
    sample = as_narrow(real_samples()[0])
    bad = dict(sample, msa=sample["msa"].clone())
    bad["msa"][0, 2] = 40
    with pytest.raises(ValueError, match=r"feature `msa`: its values lie in `range: \[0, 32\]`, found 40 at \[0, 2\]"):
        blocks.place(plan, bad, (2, 2), workflow="inference")
    for name, dtype, message in (
        ("msa_mask", torch.int32, "expected dtype int64 (or bool: a mask), got int32"),
        ("token_pad_mask", torch.uint8, "expected dtype float32 (or bool: a mask), got uint8"),
        ("msa", torch.bool, "expected dtype int64 (or an integer type holding its range [0, 32]), got bool"),
    ):
        wrong = dict(sample, **{name: sample[name].to(dtype)})
        with pytest.raises(ValueError, match=re.escape(f"feature `{name}`: {message}")) as raised:
            blocks.place(plan, wrong, (2, 2), workflow="inference")
        (tmp_path / name).mkdir()
        assert str(raised.value) in shard_refuses(wrong, tmp_path / name)


def test_expansion_refuses_a_dense_shape_its_feature_cannot_have(plan: featshard.Plan) -> None:
    """Every compact form, told a dense block of another rank or too large to address,
    and a one-hot feature told another class count, is a ValueError naming the feature,
    never a panic."""
    placed = blocks.place(plan, real_samples()[1], (2, 2), workflow="inference")
    wire = placed.wire(compact=True)
    views = blocks.buffer_views(placed.rank_buffer((0, 0), compact=True), wire)
    kinds = set()
    for slot in wire.slots:
        if slot.form is None:
            continue
        name = slot.name
        kinds.add(slot.form)
        dense = slot.dense_shape
        capsule = views[name].contiguous().__dlpack__
        wrong = [[*dense, 1], [2**62, *dense[1:]]]
        axis = plan.features[name].one_hot
        if axis is not None:  # the class count is a channel size
            wrong.append([n + (k == axis) for k, n in enumerate(dense)])
        for bad in wrong:
            with pytest.raises(ValueError, match=f"`{name}`"):
                plan._native.expand_blocks([(name, bad, capsule())])
        plan._native.expand_blocks([(name, dense, capsule())])
    assert kinds == {"one_hot", "bits", "sparse", "narrow"}


def _coo(sample: dict[str, torch.Tensor], name: str, extra: list[tuple[int, ...]], values: list[float],
         size: tuple[int, ...] | None = None) -> torch.Tensor:
    """Feature ``name`` as an uncoalesced ``torch.sparse_coo_tensor``: its nonzero
    elements, then ``extra`` elements of ``values``, of ``size`` (its dense shape)."""
    dense = sample[name].to_sparse().coalesce()
    more = torch.tensor(extra, dtype=torch.int64).reshape(len(extra), dense.sparse_dim()).mT
    indices = torch.cat([dense.indices(), more], dim=1)
    vals = torch.cat([dense.values(), torch.tensor(values, dtype=dense.values().dtype)])
    return torch.sparse_coo_tensor(indices, vals, size or tuple(sample[name].shape), check_invariants=False)


@pytest.mark.parametrize("shift", [73, -73], ids=["past-the-end", "negative"])
def test_a_sparse_tensors_coordinate_outside_it_is_refused_not_merged_by_coalescing(
    plan: featshard.Plan, shift: int
) -> None:
    """Coordinates are checked as given: an element at ``(i - 1, j + 73, 0)`` (or
    ``(i + 1, j - 73, 0)``) on 73 tokens has the flat position of the bond at ``(i, j,
    0)``, so ``coalesce()`` would fold the two into one valid element and sum them."""
    sample = real_samples()[1]
    i, j, _ = (int(c) for c in sample["token_bonds"].nonzero()[0])
    assert 1 <= i < 72, (i, j)
    extra = (i - 1, j + shift, 0) if shift > 0 else (i + 1, j + shift, 0)
    x = _coo(sample, "token_bonds", [extra], [3.0])
    message = f"coordinate {j + shift} along axis 1 is outside its 73 items"
    with pytest.raises(ValueError, match=f"feature `token_bonds`: element \\d+: {re.escape(message)}"):
        blocks.place(plan, dict(sample, token_bonds=x), (2, 2), workflow="inference")


def test_a_sparse_tensor_of_another_size_is_refused_naming_both(plan: featshard.Plan) -> None:
    """Its own size is compared with the shape the other features make: before, a
    ``(100, 100, 1)`` tensor was placed as ``(73, 73, 1)``."""
    sample = real_samples()[1]
    x = _coo(sample, "token_bonds", [], [], size=(100, 100, 1))
    with pytest.raises(ValueError, match=re.escape(
            "feature `token_bonds`: given as a sparse tensor of shape [100, 100, 1], "
            "but the sample's other features make it [73, 73, 1]")):
        blocks.place(plan, dict(sample, token_bonds=x), (2, 2), workflow="inference")
    # Its own size, uncoalesced, places as the dense feature does.
    same = blocks.place(plan, dict(sample, token_bonds=_coo(sample, "token_bonds", [], [])), (2, 2),
                        workflow="inference")
    dense = blocks.place(plan, sample, (2, 2), workflow="inference")
    assert_same_blocks(dense.blocks_at((1, 0)), same.blocks_at((1, 0)), "uncoalesced")


def test_a_sparse_feature_given_twice_over_is_refused(plan: featshard.Plan) -> None:
    """As a sparse tensor and as ``NAME.indices``/``NAME.values`` at once: before, the
    pair silently won."""
    sample = as_elements(real_samples()[1], pairs=True)
    sample["token_bonds"] = real_samples()[1]["token_bonds"].to_sparse()
    with pytest.raises(ValueError, match=re.escape(
            "feature `token_bonds`: given both as a sparse tensor and as its elements (`token_bonds.indices`)")):
        blocks.place(plan, sample, (2, 2), workflow="inference")


def test_a_map_as_wide_as_a_huge_feature_is_refused_by_the_length_limit(plan: featshard.Plan) -> None:
    """A one-hot map given as indices is as wide as another feature says its items'
    semantic is long: a 2^31-long feature is refused by the length limit before anything
    is made that wide (before: 32 GB allocated, and the interpreter killed). The big
    tensor is never written, so it takes no memory."""
    sample = as_indices(real_samples()[1])
    huge = torch.empty(2**31, dtype=torch.uint8)
    with pytest.raises(ValueError, match=re.escape(
            "axis 0 (tokens): `tokens` length 2147483648 is more than the limit of 134217728")):
        blocks.place(plan, dict(sample, token_pad_mask=huge), (2, 2), workflow="inference")


def test_sparse_input_the_executor_cannot_read_is_named_by_its_feature(plan: featshard.Plan) -> None:
    """A sparse feature on ``meta``, with complex values, or its elements as a Python
    list, is refused naming the feature and what was given (before: torch's message
    with no feature, or "given [0] uint8"); an expansion too large for memory names
    the feature and the bytes (before: "Cannot allocate memory (os error 12)")."""
    sample = real_samples()[1]
    coo = sample["token_bonds"].to_sparse()
    meta = torch.sparse_coo_tensor(coo.indices(), coo.values(), coo.shape, device="meta", check_invariants=False)
    complex_values = torch.sparse_coo_tensor(coo.indices(), coo.values().to(torch.complex64), coo.shape,
                                             check_invariants=False)
    pairs = as_elements(sample, pairs=True)
    for given, message in [
        (dict(sample, token_bonds=meta),
         "feature `token_bonds`: expected a float32 tensor, got a sparse meta tensor (no data)"),
        (dict(sample, token_bonds=complex_values),
         "feature `token_bonds`: expected a float32 tensor, got a sparse tensor of complex64 elements"),
        (dict(pairs, **{"token_bonds.values": pairs["token_bonds.values"].tolist()}),
         "feature `token_bonds`: `token_bonds.values` (its elements) must be a tensor of a spec dtype, got list"),
    ]:
        with pytest.raises(TypeError) as raised:
            blocks.place(plan, given, (2, 2), workflow="inference")
        assert str(raised.value) == message
    placed = blocks.place(plan, sample, (2, 2), workflow="inference")
    wire = placed.wire(compact=True)
    entries = blocks.buffer_views(placed.rank_buffer((0, 0), compact=True), wire)["token_bonds"]
    with pytest.raises(ValueError, match=r"feature\(s\) `token_bonds`: cannot allocate 4398046511104 bytes"):
        plan.expand_blocks([("token_bonds", [2**20, 2**20, 1], entries.contiguous().__dlpack__())])


def test_torch_expands_every_shared_vector_as_the_executor_does() -> None:
    """The executor's expansion vectors (every form, every dense dtype, rows of none, a
    partial last byte, ``-0.0`` and entries past the last, narrow ends): torch's
    expansion on a device (here the host) gives each one's dense bytes exactly, as the
    tch runtime's does on the same vectors (``runtime/src/dist/on_device.rs``)."""
    from featshard import _native

    vectors = _native.expansion_vectors()
    assert len(vectors) > 40
    for slot, packed, dense in vectors:
        raw = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
        stored = raw.view(blocks.torch_dtype(slot.dtype)).view(slot.shape)
        got = blocks.expand_block(stored, slot, torch.device("cpu"))
        assert (got.dtype, list(got.shape)) == (blocks.torch_dtype(slot.dense_dtype), slot.dense_shape), slot.name
        assert got.contiguous().view(torch.uint8).flatten().numpy().tobytes() == dense, slot.name


def _marked(x: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """``x`` as torch tensors whose memory holds other values than they read as: the
    negative bit (``_neg_view``, and what ``.conj().imag`` of a complex tensor returns)
    and a zero tensor's lack of memory (for zeros)."""
    out = [("_neg_view", (-x)._neg_view())]
    if x.is_floating_point():
        out.append(("conj().imag", torch.complex(torch.zeros_like(x), -x).conj().imag))
    return out


def test_tensors_torch_marks_lazily_give_the_blocks_of_their_resolved_copies(plan: featshard.Plan) -> None:
    """A tensor with its negative bit set holds -x in memory and reads as x: its blocks
    are x's, as of its resolved copy, through `place` (DLPack) and every rank's blocks;
    before, every block held -x."""
    sample = real_samples()[0]
    for name in ("ref_pos", "res_type", "token_pad_mask"):
        for how, lazy in _marked(sample[name]):
            assert lazy.is_neg() and torch.equal(lazy, sample[name]), (name, how)
            for mesh in [(1, 1), (2, 3)]:
                want = blocks.rank_blocks(plan, sample, mesh, workflow="inference")
                got = blocks.rank_blocks(plan, dict(sample, **{name: lazy}), mesh, workflow="inference")
                for r, (w, g) in enumerate(zip(want, got)):
                    assert_same_blocks(w, g, f"{name} {how} rank {r} of {mesh}")
    # A zero tensor (torch's, with no memory of its own) gives zeros' blocks.
    zeros = dict(sample, ref_charge=torch.zeros_like(sample["ref_charge"]))
    lazy_zeros = dict(sample, ref_charge=torch._efficientzerotensor(sample["ref_charge"].shape))
    assert lazy_zeros["ref_charge"]._is_zerotensor()
    for w, g in zip(blocks.rank_blocks(plan, zeros, (2, 2), workflow="inference"),
                    blocks.rank_blocks(plan, lazy_zeros, (2, 2), workflow="inference")):
        assert_same_blocks(w, g, "zero tensor")


def test_sample_keys_and_values_that_are_no_features_are_refused_by_name(plan: featshard.Plan) -> None:
    """Keys that are not text, or not valid text, and DTensors or other tensor subclasses
    given as a sample's values: each refused where given, naming the key or feature;
    before, a bare native error ("invalid python storage", an encoding error)."""
    sample = real_samples()[0]
    for key, error, words in [(5, TypeError, "sample key 5: a int, but feature names are str"),
                              (b"x", TypeError, "sample key b'x': a bytes"),
                              (None, TypeError, "sample key None: a NoneType"),
                              ("bad\udcff", ValueError, "not valid text (a lone surrogate)")]:
        with pytest.raises(error) as raised:
            blocks.place(plan, {**sample, key: torch.zeros(1)}, (2, 2), workflow="inference")  # type: ignore[dict-item]
        assert words in str(raised.value), str(raised.value)

    class Wrapped(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func: object, types: object, args: object = (), kwargs: object = None) -> object:
            raise AssertionError("never dispatched")

    from torch.distributed.tensor import DTensor

    assert issubclass(DTensor, torch.Tensor)
    wrapped = torch.Tensor._make_subclass(Wrapped, sample["ref_charge"])
    with pytest.raises(TypeError) as raised:
        blocks.place(plan, dict(sample, ref_charge=wrapped), (2, 2), workflow="inference")
    assert "feature `ref_charge`" in str(raised.value) and "a Wrapped (a tensor subclass" in str(raised.value)


OWNERLESS = """\
version: 1
module: ownerless
mesh: {cp: [cp0, cp1]}
semantics:
  tokens: {shard: true}
  atoms: {shard: true}
features:
  token_feat: {axes: [tokens], dtype: float32}
  atom_to_token_idx: {axes: [atoms], dtype: int64, index: {of: tokens, scope: shard_local}}
"""


def test_a_shard_local_id_naming_another_shards_item_is_refused_by_name(tmp_path: Path) -> None:
    """A token id per atom (AlphaFold3's `atom_to_token_idx`) as a `shard_local` index of
    atoms without an owner: a value whose token lives on another shard than its atom
    would arrive as another id (before: -13 and -26 on 3x3); refused naming the feature,
    the value and both shards. Values on their own shard are shifted as before."""
    spec = tmp_path / "ownerless.yaml"
    spec.write_text(OWNERLESS)
    plan = featshard.Plan(spec)
    n_tokens, n_atoms = 9, 18
    # Token 0 has seven atoms: atom 6, on the second third of the atoms, names token 0,
    # on the first third of the tokens.
    ids = torch.tensor([0] * 7 + list(range(1, 9)) + [8] * 3)
    sample = {"token_feat": torch.arange(n_tokens, dtype=torch.float32), "atom_to_token_idx": ids}
    with pytest.raises(ValueError) as raised:
        blocks.place(plan, sample, (3, 3))
    message = str(raised.value)
    assert message.startswith(
        "feature `atom_to_token_idx`, axis 0 (atoms): value 0 at [6] names tokens item 0, held by shard 0"
        " along `cp0`, but this atoms item is held by shard 1: a shard_local id can only name an item of"
        " its own shard"), message
    # The same ids, each atom on its token's shard (atoms ordered by their token's shard):
    # accepted, each rank's ids local to its token shard.
    aligned = torch.tensor([a % 3 + 3 * (a // 6) for a in range(n_atoms)])
    got = blocks.rank_blocks(plan, dict(sample, atom_to_token_idx=aligned), (3, 3))
    for r, b in enumerate(got):
        i = r // 3
        want = aligned[6 * i: 6 * (i + 1)] - 3 * i
        assert torch.equal(b["atom_to_token_idx"], want), (r, b["atom_to_token_idx"])


def test_items_cut_as_incoming_pads_that_have_an_owner_are_refused(plan: featshard.Plan) -> None:
    """A mask that marks real atoms as pads (a type flag such as AlphaFold3's
    `is_protein` taken for the atoms' pad mask) would cut real atoms: refused, naming the
    mask, the items and their owners. Before, the atoms were cut silently."""
    sample = real_samples()[1]
    real = int(sample["atom_pad_mask"].sum())
    mask = sample["atom_pad_mask"].clone()
    mask[real - 11:] = 0
    with pytest.raises(ValueError) as raised:
        blocks.place(plan, dict(sample, atom_pad_mask=mask), (2, 2), workflow="inference")
    message = str(raised.value)
    owners = sample["atom_to_token"].argmax(-1)
    first = real - 11
    assert message.startswith(
        f"feature `atom_pad_mask`, axis 0 (atoms, incoming pads): cuts atoms {first} and after as incoming"
        f" pads, but `atom_to_token` gives atoms item {first} to tokens item {int(owners[first])}, "), message
    assert "and 7 more: an incoming pad has no owner, so these items are real" in message, message
    # The sample as the featurizer emitted it: its pads own nothing, and are cut.
    assert blocks.place(plan, sample, (2, 2), workflow="inference").layout.sizes["atoms"] == real
