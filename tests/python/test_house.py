"""scripts/house.py, the house's rules scripts/test checks on every run: it passes on the
tree, and fails, naming the place, on a planted import circle (Rust and Python, the
Python one through an import over several lines), a planted long function and a
planted stale path in ARCHITECTURE.md."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "house.py"
TREES = ["spec/src", "codegen/src", "exec/src", "runtime/src", "macros/src", "python/src", "src",
         "python/featshard", "tests/data", "examples", "benches", "scripts"]


def house(root: Path) -> tuple[int, str]:
    run = subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, check=False)
    return run.returncode, run.stdout


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what the rules read."""
    for t in TREES:
        if (ROOT / t).exists():
            shutil.copytree(ROOT / t, tmp_path / t, ignore=shutil.ignore_patterns("*.safetensors", "__pycache__"))
    for f in ["ARCHITECTURE.md", "README.md", "Cargo.toml"]:
        shutil.copy(ROOT / f, tmp_path / f)
    for d in ["docs", "tests", "schema", "fuzz", "python"]:
        (tmp_path / d).mkdir(exist_ok=True)
    for f in (ROOT / "docs").iterdir():
        shutil.copy(f, tmp_path / "docs" / f.name)
    return tmp_path


def test_the_tree_keeps_the_house_rules() -> None:
    code, out = house(ROOT)
    assert code == 0, out


def test_a_planted_rust_circle_fails_naming_it(tree: Path) -> None:
    dtype = tree / "exec/src/dtype.rs"
    dtype.write_text("use crate::place::place;\n" + dtype.read_text())
    code, out = house(tree)
    assert code == 1 and "featshard-exec: import circle" in out and "dtype" in out, out


def test_a_planted_python_circle_over_several_lines_fails_naming_it(tree: Path) -> None:
    data = tree / "python/featshard/data.py"
    data.write_text(data.read_text() + "\nfrom featshard.loader import (\n    FeatureLoader,\n)\n")
    code, out = house(tree)
    assert code == 1 and "import circle featshard.data <-> featshard.loader" in out, out


def test_a_planted_long_function_fails_naming_its_place(tree: Path) -> None:
    text = tree / "src/text.rs"
    body = "".join(f"    let _x{i} = {i};\n" for i in range(80))
    lines = text.read_text().count("\n")
    text.write_text(text.read_text() + f"\nfn planted() {{\n{body}}}\n")
    code, out = house(tree)
    assert code == 1 and f"src/text.rs:{lines + 2}: fn `planted` is 82 lines (over 80)" in out, out


def test_a_planted_stale_path_fails_naming_its_line(tree: Path) -> None:
    arch = tree / "ARCHITECTURE.md"
    n = arch.read_text().count("\n")
    arch.write_text(arch.read_text() + "\nThe halo lives in `exec/src/halos.rs`.\n")
    code, out = house(tree)
    assert code == 1 and f"ARCHITECTURE.md:{n + 2}: `exec/src/halos.rs` does not exist" in out, out
