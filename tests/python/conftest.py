"""Fixtures: the featshard binary and the module it generates from examples/boltz2.yaml."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# What the gloo ranks' fork server imports once (featshard.ranks), besides torch and
# featshard: a rank imports none of it anew.
RANK_PRELOAD = ["featshard.data", "featshard.padding", "safetensors.torch", "lightning.pytorch",
                "boltz_samples", "oracle"]


def start_ranks(worker: Callable[..., None], args: tuple[Any, ...], world: int) -> None:
    """``worker(rank, *args)`` on ``world`` gloo ranks, this folder on their path."""
    from featshard.ranks import start_ranks as start

    start(worker, args, world, preload=RANK_PRELOAD, path=[str(HERE)])


def run_ranks(worker: Callable[..., None], args: tuple[Any, ...], world: int, *, deadline: float,
              daemon: bool = True) -> list[int | None]:
    """``worker(rank, *args)`` on ``world`` processes forked as :func:`start_ranks` forks
    them, where ranks may die: each rank's exit code, or None for a rank still running
    after ``deadline`` seconds (killed then: a hang, which the test reports, never a
    wait). A rank that starts processes of its own (a loader's workers) is not a
    daemon (``daemon=False``); it is killed all the same at the deadline."""
    import multiprocessing
    import time

    from featshard.ranks import start_ranks as start

    # The fork server starts (with its preloads) on the first call of the session.
    start(_nothing, (), 1, preload=RANK_PRELOAD, path=[str(HERE)])
    context = multiprocessing.get_context("forkserver")
    ranks = [context.Process(target=worker, args=(r, *args), daemon=daemon) for r in range(world)]
    for p in ranks:
        p.start()
    end = time.monotonic() + deadline
    for p in ranks:
        p.join(max(0.0, end - time.monotonic()))
    codes: list[int | None] = []
    for p in ranks:
        if p.is_alive():
            p.kill()
            p.join()
            codes.append(None)
        else:
            codes.append(p.exitcode)
    return codes


def _nothing(rank: int) -> None:
    """A rank that does nothing (starts the fork server)."""


def tool(name: str) -> str:
    """A command of the test environment: on PATH, else next to this Python."""
    return shutil.which(name) or str(Path(sys.executable).parent / name)


MypyStrict = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="session")
def mypy_strict(tmp_path_factory: pytest.TempPathFactory) -> MypyStrict:
    """``mypy --strict`` on files given together (distinct module names), from ``cwd``.
    One cache for the session, new in each: torch's stubs are analysed once, not once
    per checked file."""
    cache = tmp_path_factory.mktemp("mypy-cache")

    def run(*files: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [tool("mypy"), "--strict", "--cache-dir", str(cache), *map(str, files)]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, check=False)

    return run


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
