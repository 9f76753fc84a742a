"""The ``featshard`` command, run in process by the native module."""

from __future__ import annotations

import sys

from featshard import _native


def main() -> None:
    """Entry point of the ``featshard`` console script."""
    raise SystemExit(_native.main(["featshard", *sys.argv[1:]]))
