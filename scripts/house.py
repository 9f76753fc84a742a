#!/usr/bin/env python3
"""The house's rules, checked on every run of scripts/test: exit 1 naming every
violation by its location.

    python3 scripts/house.py [ROOT]

- no import circle between the modules of a crate or of the Python package
  (scripts/modules.py reads the graphs);
- no function over 80 lines outside tests (Rust crates' sources before their test
  module, the Python package);
- every repository path ARCHITECTURE.md names exists.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import modules  # noqa: E402 - the module graphs, from the script beside this one

LONGEST = 80
FN = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"C\"\s+)?fn\s+(\w+)")


def without_literals(line: str) -> str:
    """A line of Rust with its comment, string and char literals blanked: their braces
    are no block's."""
    line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(?:\\.|[^'\\])'", "''", line)
    return line.split("//", 1)[0]


def rust_functions(path: Path) -> list[tuple[str, int, int]]:
    """Every function of a Rust file before its test module: name, first line, lines."""
    lines = path.read_text().splitlines()
    cut = next((i for i, l in enumerate(lines) if l.strip() == "#[cfg(test)]"), len(lines))
    out = []
    i = 0
    while i < cut:
        hit = FN.match(lines[i])
        if not hit:
            i += 1
            continue
        depth, opened, j = 0, False, i
        while j < cut:
            code = without_literals(lines[j])
            if not opened and ";" in code and "{" not in code:
                break  # a declaration without a body (a trait's)
            depth += code.count("{") - code.count("}")
            opened |= "{" in code
            if opened and depth <= 0:
                break
            j += 1
        out.append((hit.group(2), i + 1, j - i + 1))
        i += 1
    return out


def python_functions(path: Path) -> list[tuple[str, int, int]]:
    tree = ast.parse(path.read_text(), str(path))
    return [(n.name, n.lineno, (n.end_lineno or n.lineno) - n.lineno + 1)
            for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def long_functions(root: Path) -> list[str]:
    found = []
    for src in modules.CRATES.values():
        for p in sorted((root / src).rglob("*.rs")):
            found += [f"{p.relative_to(root)}:{line}: fn `{name}` is {n} lines (over {LONGEST})"
                      for name, line, n in rust_functions(p) if n > LONGEST]
    for p in sorted((root / "python/featshard").rglob("*.py")):
        found += [f"{p.relative_to(root)}:{line}: def `{name}` is {n} lines (over {LONGEST})"
                  for name, line, n in python_functions(p) if n > LONGEST]
    return found


def circles(root: Path) -> list[str]:
    found = []
    graphs = {name: modules.rust_graph(root / src)[0] for name, src in modules.CRATES.items()}
    graphs["python package"] = modules.python_graph(root / "python/featshard")[0]
    for name, edges in graphs.items():
        found += [f"{name}: import circle {' <-> '.join(c)}" for c in modules.cycles(edges)]
    return found


PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:rs|py|md|sh|tera|yaml|json|toml))`|`((?:[\w-]+/)+)`")


def stale_paths(root: Path) -> list[str]:
    """Every path ARCHITECTURE.md names in backticks (a file with its extension, or a
    folder ending in `/`) found nowhere: from the root, `python/` or a crate's source
    folder (`shard_folder/check.rs` in a table of `exec`'s modules)."""
    bases = [root, root / "python", root / "python/featshard", *(root / src for src in modules.CRATES.values())]
    found = []
    text = (root / "ARCHITECTURE.md").read_text()
    for n, line in enumerate(text.splitlines(), 1):
        for hit in PATH.finditer(line):
            path = hit.group(1) or hit.group(2)
            if not any((base / path).exists() for base in bases):
                found.append(f"ARCHITECTURE.md:{n}: `{path}` does not exist")
    return found


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
    found = circles(root) + long_functions(root) + stale_paths(root)
    for f in found:
        print(f)
    print(f"house rules: {len(found)} violation{'s' if len(found) != 1 else ''}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
