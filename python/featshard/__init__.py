"""featshard: one YAML spec for every context-parallel feature placement and padding plan.

The package wraps featshard's Rust core (``featshard._native``, one abi3 module for every
CPython >= 3.10, no libtorch): the ``featshard`` command runs in process, and
:func:`plan` gives a spec's Plan IR, the numbers every generated module is made from.
"""

from __future__ import annotations

import json
import os
from typing import Any

from featshard._native import __version__, plan_json

__all__ = ["__version__", "plan", "plan_json"]


def plan(spec: str | os.PathLike[str]) -> dict[str, Any]:
    """The Plan IR of the spec file ``spec`` (what ``<module>.plan.json`` holds).

    Raises ``ValueError`` with the spec error, its file, line and column.
    """
    result: dict[str, Any] = json.loads(plan_json(os.fspath(spec)))
    return result
