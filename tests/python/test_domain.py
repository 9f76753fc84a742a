"""Domain-parallel specs (PhysicsNeMo ShardTensor): the generated module of the weather
and point-cloud examples, its validation errors, and its generated gloo parity test."""

from __future__ import annotations

import importlib
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from conftest import ROOT, MypyStrict, featshard_bin, tool

EXAMPLES = ["weather", "pointcloud", "volume"]


@pytest.fixture(scope="module")
def domain_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("domain")
    for name in EXAMPLES:
        subprocess.run(
            [str(featshard_bin()), "generate", str(ROOT / "examples" / f"{name}.yaml"), "--out", str(out), "--tests"],
            check=True, capture_output=True,
        )
    return out


@pytest.fixture(scope="module")
def weather(domain_dir: Path) -> ModuleType:
    sys.path.insert(0, str(domain_dir))
    return importlib.import_module("weather_placements")


def weather_inputs(h: int = 7, batch: int = 1) -> dict[str, torch.Tensor]:
    return {
        "state": torch.randn(batch, 26, h, 12),
        "forcing": torch.randn(batch, 4, h, 12),
        "land_sea_mask": torch.ones(h, 12),
        "target": torch.randn(batch, 26, h, 12),
        "lead_time": torch.tensor([6] * batch),
    }


def test_generate_writes_the_module_the_plan_and_the_test(domain_dir: Path) -> None:
    names = sorted(p.name for p in domain_dir.iterdir() if p.suffix in (".py", ".json"))
    assert names == [
        "pointcloud_placements.plan.json", "pointcloud_placements.py",
        "test_pointcloud_placements_parity.py", "test_volume_placements_parity.py",
        "test_weather_placements_parity.py",
        "volume_placements.plan.json", "volume_placements.py",
        "weather_placements.plan.json", "weather_placements.py",
    ]
    plan = json.loads((domain_dir / "weather_placements.plan.json").read_text())
    assert plan["mesh"] == {"cp": ["domain"], "dp": "ddp", "domain": {"uneven": [True]}}


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_package_reads_the_modules_tables_from_its_plan(domain_dir: Path, name: str) -> None:
    """The generated tables (rendered by the Rust generator) and the package's runtime
    (read from the plan file by `featshard.domain.Domain`) describe the same spec."""
    sys.path.insert(0, str(domain_dir))
    m = importlib.import_module(f"{name}_placements")
    d = m.runtime()
    assert (d.features, d.parameters, d.outputs) == (m.FEATURES, m.PARAMETERS, m.OUTPUTS)
    assert (d.semantics, d.metadata, d.placements) == (m.SEMANTICS, m.METADATA, m.PLACEMENTS)
    assert (d.domain_axes, d.dp_axis, d.uneven) == (m.DOMAIN_MESH_AXES, m.DP_MESH_AXIS, m.UNEVEN)


MESHES = {1: [(1,), (2,), (3,), (4,)], 2: [(1, 1), (2, 2), (3, 3), (2, 3), (4, 1)]}


@pytest.mark.parametrize("name", EXAMPLES)
def test_rust_blocks_equal_torch_chunks_of_the_padded_inputs(domain_dir: Path, name: str) -> None:
    """Every rank's blocks written by the byte executor (the Rust runtime's) equal, byte
    for byte, `torch.chunk` of the padded inputs along each split axis (how ShardTensor
    splits them), on random samples for every mesh (1 to 4 ranks per axis)."""
    sys.path.insert(0, str(domain_dir))
    m = importlib.import_module(f"{name}_placements")
    test = importlib.import_module(f"test_{name}_placements_parity")
    for sizes in MESHES[len(m.DOMAIN_MESH_AXES)]:
        for seed in range(2):
            inputs = test.random_inputs(seed, sizes)
            padded = m.pad_inputs(inputs, sizes)
            got = m.rank_blocks(inputs, sizes, threads=1 + seed)
            coords = list(itertools.product(*(range(n) for n in sizes)))
            assert len(got) == len(coords)
            for blocks, coord in zip(got, coords):
                assert sorted(blocks) == sorted(m.FEATURES), (sizes, coord)
                for feature, info in m.FEATURES.items():
                    want = padded[feature]
                    for d, axis in enumerate(info.splits):
                        if axis is not None:
                            want = torch.chunk(want, sizes[axis], dim=d)[coord[axis]]
                    block = blocks[feature]
                    assert (block.dtype, block.shape) == (want.dtype, want.shape), (feature, sizes, coord)
                    assert torch.equal(block.view(torch.uint8) if block.dtype != torch.bool else block,
                                       want.contiguous().view(torch.uint8) if want.dtype != torch.bool else want), \
                        (feature, sizes, coord)


def test_one_buffer_for_every_ranks_blocks_is_refused_on_a_domain_plan(weather: ModuleType) -> None:
    """Uneven ranks' blocks differ in shape: the CP path's one buffer layout per rank
    (what `featshard.distribute` sends) is refused by name, not written short."""
    from featshard import blocks

    placed = blocks.place(weather.plan(), weather_inputs(), (3,))
    with pytest.raises(ValueError, match="`weather_placements` is a domain-parallel plan"):
        placed.rank_buffer((0, 0))
    assert placed.blocks_at((2,))["state"].shape == (1, 26, 1, 12)
    # One index per axis of the spec's mesh: a second is no coordinate of a one-axis mesh.
    with pytest.raises(ValueError, match=r"^coord: \(2, 0\) is not on mesh domain=3"):
        placed.blocks_at((2, 0))


def test_placements_follow_the_axis_semantics(weather: ModuleType) -> None:
    from torch.distributed.tensor import Replicate, Shard

    assert weather.PLACEMENTS["state"] == (Shard(2),)          # [B, C, H, W]: H over domain
    assert weather.PLACEMENTS["land_sea_mask"] == (Shard(0),)
    assert weather.PLACEMENTS["target"] == (Replicate(),)      # labels replicated
    assert weather.PLACEMENTS["lead_time"] == (Replicate(),)


def test_planned_uneven_shapes_are_torch_chunk_pieces(weather: ModuleType) -> None:
    for ranks in range(1, 6):
        for n in range(ranks, 40):
            pieces = [int(c.shape[0]) for c in torch.chunk(torch.empty(n), ranks)]
            if len(pieces) < ranks:
                with pytest.raises(ValueError, match="empty"):
                    weather.chunk_sizes(n, ranks)
            else:
                assert weather.chunk_sizes(n, ranks) == pieces
    assert weather.local_shape("state", (1, 26, 7, 12), (3,), (2,)) == (1, 26, 1, 12)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda x: x.update(state=torch.randn(2, 26, 7, 12)),
         "feature `state`, axis 0 (batch): the per-domain-group batch size must be 1, got 2"),
        (lambda x: x.update(forcing=torch.randn(1, 4, 8, 12)),
         "feature `land_sea_mask`, axis 0 (lat): length 7, but feature `forcing` has lat length 8"),
        (lambda x: x.update({k: v.narrow(-2 if v.dim() > 2 else 0, 0, 2) for k, v in x.items() if k != "lead_time"}),
         "feature `forcing`, axis 2 (lat): 2 items over 3 ranks would leave a shard empty on mesh axis `domain`"),
        (lambda x: x.update(state=torch.randn(1, 25, 7, 12)),
         "feature `state`, axis 1 (channel): expected size 26, got 25"),
        (lambda x: x.pop("forcing"), "feature `forcing`: missing from the sample"),
        (lambda x: x["land_sea_mask"].view(-1)[5].fill_(0.5),
         "feature `land_sea_mask`: a mask holds 0 or 1 (false/true, 0/1, 0.0/1.0), found 0.5 at flat index 5"),
    ],
    ids=["batch_not_1", "lengths_differ", "empty_shards", "channels", "missing", "mask_value"],
)
def test_inputs_that_cannot_be_scattered_are_named(weather: ModuleType, change, message: str) -> None:  # type: ignore[no-untyped-def]
    inputs = weather_inputs()
    change(inputs)
    with pytest.raises(weather.FeatureDistributionError) as e:
        weather.check_inputs(inputs, (3,))
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("dtype", "shape", "message"),
    [
        ("float32", [1, 8, 7, 12], None),
        ("float32", [8, 7, 12], "feature `pos_embed`: expected 4 axes, got shape [8, 7, 12]"),
        ("float64", [1, 8, 7, 12], "feature `pos_embed`: expected dtype float32, got float64"),
        ("float32", [1, 9, 7, 12], "feature `pos_embed`, axis 1 (channel): expected size 8, got 9"),
        ("float32", [1, 8, 2, 12],
         "feature `pos_embed`, axis 2 (lat): 2 items over 3 ranks would leave a shard empty on mesh axis `domain`"),
    ],
    ids=["fits", "rank", "dtype", "channel", "shorter_than_its_ranks"],
)
def test_a_declared_parameter_that_cannot_be_sharded_is_named_by_the_executor(
    dtype: str, shape: list[int], message: str | None
) -> None:
    """A model's declared parameter (``pos_embed``), before FSDP2 shards it over the
    domain mesh: the executor's checks, named by the model's dotted name on the way
    out."""
    import featshard
    from featshard.domain import Domain, FeatureDistributionError

    domain = Domain(featshard.Plan(ROOT / "examples" / "weather.yaml"))
    p = torch.zeros(shape, dtype=featshard.blocks.torch_dtype(dtype))
    if message is None:
        domain._check_parameter("encoder.pos_embed", "pos_embed", p, (3,))
        return
    with pytest.raises(FeatureDistributionError) as e:
        domain._check_parameter("encoder.pos_embed", "pos_embed", p, (3,))
    assert str(e.value) == f"parameter `encoder.pos_embed`: {message}"


def test_generated_domain_python_passes_ruff_and_mypy(domain_dir: Path, mypy_strict: MypyStrict) -> None:
    files = [str(p) for p in sorted(domain_dir.glob("*.py"))]
    r = subprocess.run([tool("ruff"), "check", "--no-cache", *files],
                       capture_output=True, text=True, cwd=domain_dir, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    r = mypy_strict(*files, cwd=domain_dir)
    assert r.returncode == 0, r.stdout + r.stderr


# The gradient test's model for the weather example: two 3x3 convolutions over the
# state's lat x lon plane (lat sharded, uneven over 3 ranks) with a learned positional
# embedding between them (the spec's `pos_embed` parameter: a DTensor over the domain
# on the FSDP2 path, plain on the others), and a mean-square loss.
WEATHER_MODEL = """
import torch

LENGTHS = {"lat": 8, "lon": 12}


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(26, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 26, 3, padding=1)
        self.pos_embed = torch.nn.Parameter(0.1 * torch.randn(1, 8, LENGTHS["lat"], LENGTHS["lon"]))

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x) + self.pos_embed))


def model_factory() -> torch.nn.Module:
    torch.manual_seed(0)
    return Model()


def forward(model, inputs):
    return model(inputs["state"])


def loss(output):
    return output.square().mean()
"""


# The volume example's (a 2D domain, dx x dy): two 3x3 convolutions over the x, y plane
# of the velocity [B, X, Y, 3], moved channel-first; both domain axes split.
VOLUME_MODEL = """
import torch


def model_factory() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 3, 3, padding=1)
    )


def forward(model, inputs):
    return model(inputs["velocity"].permute(0, 3, 1, 2))


def loss(output):
    return output.square().mean()
"""
MODELS = {"weather": WEATHER_MODEL, "volume": VOLUME_MODEL}


@pytest.mark.parametrize("name", EXAMPLES)
def test_generated_shard_tensor_parity_test_passes(domain_dir: Path, name: str) -> None:
    """The generated test: 3 gloo ranks (uneven shards; 3 x 2 on the 2D volume domain)
    and ddp 2 x domain 2; both scatters (source rank, and each rank reading its part of a
    file) and gather give back the serial inputs, planned local shapes equal
    ShardTensor's own. For weather (1D domain) and volume (2D domain), with a conv model
    given, the gradient parity test too: domain only, DDP and FSDP2 on ddp 2 x domain 2,
    and DDP alone (ddp 2 x a domain of one rank)."""
    if name in MODELS:
        (domain_dir / f"{name}_placements_model.py").write_text(MODELS[name])
    test = domain_dir / f"test_{name}_placements_parity.py"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        capture_output=True, text=True, cwd=domain_dir, check=False,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    want = "6 passed" if name in MODELS else "2 passed, 4 skipped"
    assert want in r.stdout, r.stdout[-2000:]


@pytest.mark.parametrize("name", EXAMPLES)
def test_domain_examples_validate_against_the_json_schema(name: str) -> None:
    import jsonschema
    import yaml

    schema = json.loads(subprocess.run([str(featshard_bin()), "schema"], capture_output=True, check=True).stdout)
    jsonschema.validate(yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text()), schema)


@pytest.fixture(scope="module")
def volume(domain_dir: Path) -> ModuleType:
    sys.path.insert(0, str(domain_dir))
    return importlib.import_module("volume_placements")


def _explain(mesh: str, xs: int, ys: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(featshard_bin()), "explain", str(ROOT / "examples" / "volume.yaml"), "--mesh", mesh,
         "--lengths", f"batch=1,xs={xs},ys={ys}"],
        capture_output=True, text=True, check=False,
    )


@pytest.mark.parametrize("mesh", [(3, 2), (2, 3), (1, 1), (4, 2)])
def test_stride_and_halo_padding_is_the_rust_plans(volume: ModuleType, mesh: tuple[int, int]) -> None:
    for ys in (1, 2, 5, 9, 13):
        r = _explain(f"{mesh[0]}x{mesh[1]}", 12, ys)
        assert r.returncode == 0, r.stderr
        rust = int(next(line for line in r.stdout.splitlines() if line.startswith("ys: padded to")).split()[-1])
        ours = volume.padded_length("ys", ys, mesh)
        assert ours == rust, (ys, mesh)
        assert ours % (2 * mesh[1]) == 0 and ours // mesh[1] >= 3


def test_uneven_chunks_that_break_a_halo_are_refused_as_rust_refuses_them(volume: ModuleType) -> None:
    inputs = {
        "velocity": torch.randn(1, 7, 4, 3), "pressure": torch.randn(1, 7, 4),
        "fluid_mask": torch.ones(7, 4, dtype=torch.bool), "reynolds": torch.tensor([100.0]),
    }
    with pytest.raises(volume.FeatureDistributionError) as e:
        volume.check_inputs(inputs, (3, 2))
    r = _explain("3x2", 7, 4)
    assert r.returncode != 0
    assert str(e.value) in r.stderr, (str(e.value), r.stderr)
    assert "7 items over 3 ranks of mesh axis `dx` give shards [3, 3, 1]" in str(e.value)
    assert "at least 2 long" in str(e.value)


def test_pad_inputs_puts_the_padded_sample_on_the_device_asked(weather: ModuleType) -> None:
    """A CPU sample from a DataLoader goes to the mesh's device before any collective
    (NCCL cannot broadcast CPU tensors); `meta` stands in for a GPU here."""
    inputs = weather_inputs()
    padded = weather.pad_inputs(inputs, (3,), torch.device("meta"))
    lengths = weather.check_inputs(inputs, (3,))
    for name, x in padded.items():
        assert x.device.type == "meta", name
        assert tuple(x.shape) == weather.global_shape(name, lengths, (3,)), name
    assert all(x.device.type == "cpu" for x in weather.pad_inputs(inputs, (3,)).values())


MANAGER_ON_ANOTHER_DEVICE = """
import sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import weather_placements as P
from torch.distributed.device_mesh import init_device_mesh
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
P.adopt_process_group(torch.device("meta"))
mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("ddp", "domain"))
for call in (lambda: P.scatter(None, mesh), lambda: P.scatter_local(lambda n, w, o: None, {}, mesh)):
    try:
        call()
        print("scattered")
    except P.FeatureDistributionError as e:
        print(e)
"""


def test_a_manager_on_another_device_than_the_mesh_is_refused(domain_dir: Path, tmp_path: Path) -> None:
    """PhysicsNeMo allocates the non-source ranks' buffers on its manager's device: one
    that is not the mesh's (a GPU run whose device was never set) is refused by name
    before any collective."""
    r = subprocess.run([sys.executable, "-c", MANAGER_ON_ANOTHER_DEVICE, str(domain_dir), str(tmp_path / "store")],
                       capture_output=True, text=True, check=False, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all("allocates on meta, but the mesh is on cpu" in x for x in lines), r.stdout


SOURCE_FAILS_PADDING = """
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import weather_placements as P
from featshard.domain import tables
from torch.distributed.device_mesh import init_device_mesh
rank = int(sys.argv[3])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
P.adopt_process_group()
mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("ddp", "domain"))
def failing(*args, **kwargs):
    raise RuntimeError("out of memory padding the sample")
tables.DomainTables._padded = failing
inputs = {"state": torch.randn(1, 26, 7, 12), "forcing": torch.randn(1, 4, 7, 12),
          "land_sea_mask": torch.ones(7, 12), "target": torch.randn(1, 26, 7, 12), "lead_time": torch.tensor([6])}
try:
    P.scatter(inputs if rank == 0 else None, mesh)
    print(json.dumps("scattered"))
except Exception as e:
    print(json.dumps(f"{type(e).__name__}: {e}"))
"""


def test_an_error_the_source_meets_padding_is_raised_on_every_rank(domain_dir: Path, tmp_path: Path) -> None:
    """A failure on the source that is not the sample's (memory, a device) reaches every
    rank of the domain group too, with its type and message: none is left waiting."""
    ranks = [subprocess.Popen([sys.executable, "-c", SOURCE_FAILS_PADDING, str(domain_dir), str(tmp_path / "store"),
                               str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in ranks]
    got = [json.loads(out.splitlines()[-1]) if out else err[-2000:] for out, err in outs]
    assert got == ["RuntimeError: out of memory padding the sample"] * 2, got


BAD_SAMPLES_SCATTERED = """
import json, sys, torch, torch.distributed as dist
from safetensors.torch import save_file
sys.path.insert(0, sys.argv[1])
import weather_placements as P
from featshard.blocks import place
from torch.distributed.device_mesh import init_device_mesh
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
P.adopt_process_group()
mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("ddp", "domain"))
def sample():
    return {"state": torch.randn(1, 26, 7, 12), "forcing": torch.randn(1, 4, 7, 12),
            "land_sea_mask": torch.ones(7, 12), "target": torch.randn(1, 26, 7, 12), "lead_time": torch.tensor([6])}
changes = {
    "batch_not_1": lambda x: x.update(state=torch.randn(2, 26, 7, 12)),
    "lengths_differ": lambda x: x.update(forcing=torch.randn(1, 4, 8, 12)),
    "channels": lambda x: x.update(state=torch.randn(1, 25, 7, 12)),
    "dtype": lambda x: x.update(state=torch.randn(1, 26, 7, 12, dtype=torch.float64)),
    "missing": lambda x: x.pop("forcing"),
    "mask_value": lambda x: x["land_sea_mask"].view(-1)[5].fill_(0.5),
    "unknown": lambda x: x.update(extra=torch.zeros(3)),
}
out = {}
for name, change in changes.items():
    x = sample()
    change(x)
    got = {}
    try:
        place(P.plan(), x, (1,))
    except ValueError as e:
        got["executor"] = str(e)
    for how, call in (("scatter", lambda: P.scatter(x, mesh)),
                      ("scatter_local", lambda: P.scatter_local(*P.safetensors_source(path), mesh))):
        path = sys.argv[2] + "-" + name + ".safetensors"
        save_file({k: v.contiguous() for k, v in x.items()}, path)
        try:
            call()
            got[how] = None
        except P.FeatureDistributionError as e:
            got[how] = str(e)
    out[name] = got
print(json.dumps(out))
"""


def test_domain_scatters_refuse_a_bad_sample_with_the_executors_message(domain_dir: Path, tmp_path: Path) -> None:
    """Each bad-input class that applies to a domain plan: `scatter` (one source rank) raises
    the byte executor's own message, the one `featshard shard` prints for a CP plan, and
    `scatter_local` (each rank reading a file's header and its part) the same message for
    every class a header shows; values (a mask of 0.5) are only read by `scatter`, and a
    file's extra tensors are not the sample's."""
    r = subprocess.run([sys.executable, "-c", BAD_SAMPLES_SCATTERED, str(domain_dir), str(tmp_path / "store")],
                       capture_output=True, text=True, check=False, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    for name, messages in got.items():
        assert messages["executor"], name
        assert messages["scatter"] == messages["executor"], (name, messages)
        if name in ("mask_value", "unknown"):
            assert messages["scatter_local"] is None, (name, messages)
        else:
            assert messages["scatter_local"] == messages["executor"], (name, messages)
    assert "the per-domain-group batch size must be 1, got 2" in got["batch_not_1"]["executor"]


def test_setup_on_gpus_makes_the_local_gpu_current(weather: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch of `setup`, with CUDA and the process group stubbed (no GPU here):
    under torchrun PhysicsNeMo's public initialiser starts the group; with an
    `init_method` NCCL starts on this process's GPU, made current first, and the manager
    takes that device."""
    import torch.distributed as dist
    from physicsnemo.distributed import DistributedManager

    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(DistributedManager, "_shared_state", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", torch.device(d))))
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(calls))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)

    def initialize() -> None:
        calls.append(("initialize", None))
        DistributedManager._shared_state.update(_is_initialized=True, _distributed=True)

    def init_process_group(backend: str, **kw: object) -> None:
        calls.append(("init_process_group", (backend, kw["device_id"])))

    monkeypatch.setattr(DistributedManager, "initialize", staticmethod(initialize))
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    from featshard.domain import model as domain

    domain._start_group(None, None, None, None)
    assert calls == [("initialize", None)]

    calls.clear()
    monkeypatch.setattr(DistributedManager, "_shared_state", {})
    domain._start_group("file:///tmp/x", 1, 4, None)
    gpu = torch.device("cuda", 1)
    assert calls == [("set_device", gpu), ("init_process_group", ("nccl", gpu)), ("set_device", gpu)]
    assert DistributedManager._shared_state["_device"] == gpu
    assert DistributedManager._shared_state["_rank"] == 1


def test_setup_checks_the_mesh_against_the_spec(weather: ModuleType) -> None:
    with pytest.raises(weather.FeatureDistributionError, match=r"domain sizes \(2, 2\)"):
        weather.setup((2, 2))


def test_a_one_axis_domain_plan_refuses_a_two_axis_mesh_by_name() -> None:
    """A mesh with more sizes than the plan's domain axes is refused by the spec's own
    check (`MeshPlan::matched`), as `featshard explain --mesh 3x2` refuses it, never
    read as a two-axis layout."""
    import featshard
    from featshard import blocks

    plan = featshard.Plan(ROOT / "examples" / "weather.yaml")
    want = "sizes [3, 2] for the spec's mesh (domain): one size per axis (`3`)"
    with pytest.raises(ValueError) as placed:
        blocks.place(plan, weather_inputs(), (3, 2))
    assert want in str(placed.value)
    with pytest.raises(ValueError) as laid_out:
        plan.layout((3, 2), {"batch": 1, "lat": 7, "lon": 12})
    assert want in str(laid_out.value)
    r = subprocess.run([str(featshard_bin()), "explain", str(ROOT / "examples" / "weather.yaml"), "--mesh", "3x2"],
                       capture_output=True, text=True, check=False)
    assert r.returncode != 0 and want in r.stderr, r.stderr
    # Every native geometry call takes its mesh through the same check.
    for call in (lambda: plan.padded_length("lat", 7, [3, 2]),
                 lambda: plan.domain_window("state", [1, 26, 7, 12], [3, 2], [0, 0])):
        with pytest.raises(ValueError, match=re.escape(want)):
            call()
    with pytest.raises(ValueError, match=r"sizes \[2, 2, 2\] for the spec's mesh \(domain\): one size per axis \(`2`\)"):
        plan.padded_length("lat", 7, [2, 2, 2])
