"""The Python package: the wheel the test command builds (maturin, target/wheels/),
installed into a fresh virtual environment, gives the featshard command and the plan API
with no Rust toolchain on PATH; it ships its types (py.typed) and passes mypy --strict.

The fresh environment sees torch alone (the torch distribution and what it requires,
linked from this environment's site-packages), so the generated module is shown to
import with torch and the package only.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, MypyStrict, tool

SPEC = ROOT / "examples" / "boltz2.yaml"


def wheel() -> Path:
    found = sorted((ROOT / "target" / "wheels").glob("featshard-*.whl"))
    if len(found) != 1:
        pytest.fail(f"expected one wheel in target/wheels (scripts/test builds it), found {found}")
    return found[0]


def distribution_closure(name: str) -> set[str]:
    """A distribution and every distribution it requires (markers for this interpreter)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        dist = md.distribution(todo.pop())
        key = dist.metadata["Name"].lower()
        if key in seen:
            continue
        seen.add(key)
        for req in dist.requires or []:
            spec, _, marker = req.partition(";")
            if "extra ==" in marker:
                continue
            if marker.strip() and not _marker_holds(marker):
                continue
            todo.append(re.split(r"[\s<>=!~\[(]", spec.strip(), maxsplit=1)[0])
    return seen


def _marker_holds(marker: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker.strip()).evaluate()


def torch_only_site(dest: Path) -> Path:
    """A folder holding links to torch's files and its requirements', nothing else."""
    dest.mkdir()
    for name in distribution_closure("torch"):
        dist = md.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in tops:
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (dest / top).exists():
                (dest / top).symlink_to(src)
    return dest


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("package")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", "--no-deps",
         "--disable-pip-version-check", str(wheel())],
        check=True,
    )
    site = next((venv / "lib").glob("python3.*")) / "site-packages"
    (site / "torch_only.pth").write_text(str(torch_only_site(root / "torch-only")) + "\n")
    return venv


def run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # No cargo, no rustc: PATH holds the venv and the system's basic tools only.
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(cwd)}
    assert shutil.which("cargo", path=env["PATH"]) is None
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, check=False)


def test_the_wheel_ships_its_types_and_one_abi3_module() -> None:
    names = zipfile.ZipFile(wheel()).namelist()
    assert "featshard/py.typed" in names and "featshard/_native.pyi" in names
    assert [n for n in names if n.startswith("featshard/_native")] == [
        "featshard/_native.abi3.so", "featshard/_native.pyi"]
    assert "-abi3-" in wheel().name and "cp310" in wheel().name


def test_generate_from_the_installed_package_with_no_cargo(
    fresh_venv: Path, tmp_path: Path, mypy_strict: MypyStrict
) -> None:
    out = tmp_path / "gen"
    done = run(fresh_venv, "featshard", "generate", str(SPEC), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # Byte for byte the checked-in goldens: the same generator, reached through Python.
    golden = ROOT / "tests" / "golden" / "boltz2"
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in golden.iterdir())
    for p in out.iterdir():
        assert p.read_bytes() == (golden / p.name).read_bytes(), p.name
    # The generated module imports with torch and the package alone.
    imported = run(fresh_venv, "python", "-c",
                   "import sys; sys.path.insert(0, sys.argv[1]); import boltz2_placements as m; "
                   "print(' '.join(sorted(m.PLACEMENTS)))",
                   str(out), cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    features = featshard_plan(fresh_venv, tmp_path)["features"]
    assert isinstance(features, dict)
    tensors = sorted(n for n, f in features.items() if "placements" in f)
    assert imported.stdout.split() == tensors
    bad = run(fresh_venv, "python", "-c", "import lightning", cwd=tmp_path)
    assert bad.returncode != 0, "the fresh environment should hold torch only"
    for checked in (subprocess.run([tool("ruff"), "check", "--no-cache", str(out)],
                                   capture_output=True, text=True, check=False, cwd=out),
                    mypy_strict(out / "boltz2_placements.py", cwd=out),
                    mypy_strict(out / "boltz2_placements_data.py", cwd=out)):
        assert checked.returncode == 0, checked.stdout + checked.stderr


BOUND = """
import sys
sys.path.insert(0, sys.argv[1])
import boltz2_placements_data as d
try:
    print(d.plan().module)
except (ValueError, FileNotFoundError) as e:
    print(type(e).__name__, e)
"""


def test_the_generated_data_module_binds_the_package_to_its_plan_file(
    fresh_venv: Path, tmp_path: Path
) -> None:
    """`<module>_data.py` holds no pipeline of its own: it reads the plan next to it, and
    refuses a plan file made from another spec, or none, by path and with the fix."""
    out = tmp_path / "gen"
    assert run(fresh_venv, "featshard", "generate", str(SPEC), "--out", str(out), cwd=tmp_path).returncode == 0
    data = (out / "boltz2_placements_data.py").read_text()
    for geometry in ("def _repad", "torch.full", "dist.scatter", "narrow("):
        assert geometry not in data, geometry
    bound = run(fresh_venv, "python", "-c", BOUND, str(out), cwd=tmp_path)
    assert bound.returncode == 0 and bound.stdout.split() == ["boltz2_placements"], bound.stderr
    plan_file = out / "boltz2_placements.plan.json"
    text = plan_file.read_text()
    sha = re.search(r'"sha256": "([0-9a-f]{64})"', text)
    assert sha is not None
    plan_file.write_text(text.replace(sha.group(1), "0" * 64))
    stale = run(fresh_venv, "python", "-c", BOUND, str(out), cwd=tmp_path).stdout
    assert stale.startswith("ValueError") and "made from another spec" in stale, stale
    assert "featshard generate" in stale, stale
    plan_file.unlink()
    missing = run(fresh_venv, "python", "-c", BOUND, str(out), cwd=tmp_path).stdout
    assert missing.startswith("FileNotFoundError") and "boltz2_placements.plan.json" in missing, missing


def featshard_plan(venv: Path, cwd: Path) -> dict[str, object]:
    import json

    done = run(venv, "python", "-c",
               "import json, sys, featshard; print(json.dumps(featshard.plan(sys.argv[1])))",
               str(SPEC), cwd=cwd)
    assert done.returncode == 0, done.stderr
    plan: dict[str, object] = json.loads(done.stdout)
    return plan


def test_the_plan_api_and_its_errors(fresh_venv: Path, tmp_path: Path) -> None:
    plan = featshard_plan(fresh_venv, tmp_path)
    assert plan["module"] == "boltz2_placements"
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nmodule: m\nmesh: {cp: [cp0, cp1]}\nsemantics: {}\nfeatures:\n  x: {axes: [nope]}\n")
    done = run(fresh_venv, "python", "-c", "import sys, featshard; featshard.plan(sys.argv[1])",
               str(bad), cwd=tmp_path)
    assert done.returncode != 0
    assert "ValueError" in done.stderr and "bad.yaml:6:3" in done.stderr
    assert "feature `x`: needs `dtype`" in done.stderr
    # The command's exit status and messages come through unchanged.
    failed = run(fresh_venv, "featshard", "validate", str(bad), cwd=tmp_path)
    assert failed.returncode == 1 and "feature `x`: needs `dtype`" in failed.stderr
    assert run(fresh_venv, "featshard", "--version", cwd=tmp_path).stdout.startswith("featshard ")


def test_the_package_passes_mypy_strict_and_ruff(mypy_strict: MypyStrict) -> None:
    pkg = ROOT / "python" / "featshard"
    env = {**os.environ, "MYPYPATH": str(ROOT / "python")}
    for checked in (mypy_strict(pkg, cwd=ROOT, env=env),
                    subprocess.run([tool("ruff"), "check", "--no-cache", str(pkg)],
                                   capture_output=True, text=True, check=False, env=env)):
        assert checked.returncode == 0, checked.stdout + checked.stderr


GEOMETRY = """
import sys
import featshard
sys.path[:0] = sys.argv[1:3]
import boltz2_placements as m
import oracle
from boltz_samples import random_sample

plan = featshard.Plan(sys.argv[3])
checked = 0
for mesh in [(1, 1), (2, 2), (3, 3), (2, 3), (4, 1)]:
    for seed in range(3):
        s = random_sample(m, 30 + 7 * seed, seed=seed, atoms_per_token=(0, 6), msa_rows=8,
                          templates=2, ensemble=1)
        taken = oracle.intake(m, s)
        lengths = oracle._sample_lengths(m, taken)
        counts, owners = {}, {}
        for sem, info in m.SEMANTICS.items():
            if info.padding != "owner_blocks" or sem not in lengths:
                continue
            if info.owner_counts in taken:
                counts[sem] = taken[info.owner_counts].tolist()
            else:
                owners[sem] = taken[info.owner_map].argmax(1).tolist()
        native = plan.layout(mesh, lengths, counts, owners)
        python = oracle.layouts(m, s, mesh)
        assert sorted(python) == sorted(native.padded), (mesh, seed)
        for sem, lay in python.items():
            assert native.padded[sem] == lay.padded, (mesh, seed, sem)
            if lay.positions is None:
                assert sem not in native.positions, (mesh, seed, sem)
            else:
                assert native.positions[sem] == lay.positions.tolist(), (mesh, seed, sem)
                assert native.per_block[sem] == lay.per_block, (mesh, seed, sem)
        padded = oracle.pad_features(m, s, mesh)
        names = sorted(n for n in padded if n in m.PLACEMENTS)
        for n, sh in plan.shapes(native, names).items():
            assert list(padded[n].shape) == sh.padded, (mesh, seed, n)
            local = sh.local
            for rank in range(mesh[0] * mesh[1]):
                window = plan.block_window(n, local, featshard.coords(mesh, rank), mesh)
                assert [w[1] for w in window] == local and all(
                    a + b <= p for (a, b), p in zip(window, sh.padded)), (n, rank)
        checked += 1
print(checked)
"""


def test_the_native_geometry_equals_the_reference(fresh_venv: Path, tmp_path: Path) -> None:
    """Padded lengths, owner-block positions and padded shapes from the package's native
    Plan (the spec crate's functions) equal the Python reference's (`oracle.py`), on random Boltz
    samples for meshes 1x1, 2x2, 3x3, 2x3, 4x1; every rank's block window fits."""
    out = tmp_path / "gen"
    assert run(fresh_venv, "featshard", "generate", str(SPEC), "--out", str(out), cwd=tmp_path).returncode == 0
    done = run(fresh_venv, "python", "-c", GEOMETRY, str(out), str(ROOT / "tests" / "python"), str(SPEC),
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["15"]
