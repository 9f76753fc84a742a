"""Fixtures: the featshard binary and the module it generates from examples/boltz2.yaml."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def featshard_bin() -> Path:
    env = os.environ.get("FEATSHARD_BIN")
    path = Path(env) if env else ROOT / "target" / "debug" / "featshard"
    if not path.exists():
        pytest.fail(f"featshard binary not found at {path}: build it (cargo build) or set FEATSHARD_BIN")
    return path


@pytest.fixture(scope="session")
def generated_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("generated")
    subprocess.run(
        [str(featshard_bin()), "generate", str(ROOT / "examples" / "boltz2.yaml"), "--out", str(out)],
        check=True,
    )
    return out


def import_generated(generated_dir: Path, name: str) -> ModuleType:
    """Imports a generated module by name (the data module imports the placements one)."""
    if str(generated_dir) not in sys.path:
        sys.path.insert(0, str(generated_dir))
    return importlib.import_module(name)


@pytest.fixture(scope="session")
def data(generated_dir: Path, placements: ModuleType) -> ModuleType:
    return import_generated(generated_dir, "boltz2_placements_data")


@pytest.fixture(scope="session")
def placements(generated_dir: Path) -> ModuleType:
    path = generated_dir / "boltz2_placements.py"
    spec = importlib.util.spec_from_file_location("boltz2_placements", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["boltz2_placements"] = module
    spec.loader.exec_module(module)
    return module
