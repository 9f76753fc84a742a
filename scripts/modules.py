#!/usr/bin/env python3
"""The module graph of every crate and of the Python package: import cycles, the
longest modules, and public items per Rust crate. Run from the repository root:

    python3 scripts/modules.py            # cycles, sizes, public items
    python3 scripts/modules.py --cycles   # cycles only; exit 1 if there is one

A Rust module's imports are its `use crate::...` and `use super::...` paths (and
`crate::a::b` paths in its code), resolved to the module files of its crate; a Python
module's are its `from featshard... import` statements, read by Python's parser. Test modules (`#[cfg(test)]` and
after) are left out: a test may reach anywhere.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

CRATES = {
    "featshard-spec": "spec/src",
    "featshard-codegen": "codegen/src",
    "featshard-exec": "exec/src",
    "featshard-runtime": "runtime/src",
    "featshard-macros": "macros/src",
    "featshard-python": "python/src",
    "featshard": "src",
}


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts) or "crate"


def code_of(path: Path) -> str:
    """A Rust file's code before its test module, comments (doc links among them) out."""
    text = path.read_text()
    cut = text.find("#[cfg(test)]")
    text = text if cut < 0 else text[:cut]
    return re.sub(r"//[^\n]*", "", text)


def rust_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, int]]:
    files = {module_name(root, p): p for p in sorted(root.rglob("*.rs"))}
    edges: dict[str, set[str]] = {m: set() for m in files}
    sizes: dict[str, int] = {}
    for m, p in files.items():
        code = code_of(p)
        sizes[m] = code.count("\n")
        here = m.split("::") if m != "crate" else []
        for head, tail in re.findall(r"\b(crate|super|self)((?:::\w+)+)", code):
            parts = [s for s in tail.split("::") if s]
            # `super` of `a::b` (a/b.rs) and of `a` (a/mod.rs) alike is `here` less its last.
            base = {"crate": [], "super": here[:-1], "self": here}[head]
            target = resolve(files, base + parts)
            # Edges to a module's own ancestors are its parents' items, not a cycle.
            if target is not None and target not in ("crate", m) and not m.startswith(target + "::"):
                edges[m].add(target)
    # A module holds its children: what a child imports, its parent does.
    for m in files:
        if "::" in m:
            edges[m.rsplit("::", 1)[0]].add(m)
    return edges, sizes


def resolve(files: dict[str, Path], parts: list[str]) -> str | None:
    """The longest prefix of `parts` that names a module file."""
    for k in range(len(parts), 0, -1):
        name = "::".join(parts[:k])
        if name in files:
            return name
    return None


def python_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, int]]:
    """Every `from featshard... import` and `import featshard...` of each module, read
    by Python's own parser (an import over several lines, one in a function)."""
    files = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in sorted(root.rglob("*.py"))}
    edges: dict[str, set[str]] = {m: set() for m in files}
    sizes = {m: p.read_text().count("\n") for m, p in files.items()}
    for m, p in files.items():
        package = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)]
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in files and a.name != m:
                        edges[m].add(a.name)
                continue
            else:
                continue
            for n in names:
                if f"{target}.{n}" in files:
                    edges[m].add(f"{target}.{n}")
            if target in files and target != m and not m.startswith(target + "."):
                if not all(f"{target}.{n}" in files for n in names):
                    edges[m].add(target)
    return edges, sizes


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def public_items(root: Path) -> int:
    n = 0
    for p in root.rglob("*.rs"):
        n += len(re.findall(r"^\s*pub (?:fn|struct|enum|trait|type|const|static|mod|use) ", code_of(p), re.M))
    return n


def main() -> int:
    only_cycles = "--cycles" in sys.argv
    found = False
    graphs = {name: rust_graph(Path(src)) for name, src in CRATES.items()}
    graphs["python package"] = python_graph(Path("python/featshard"))
    for name, (edges, sizes) in graphs.items():
        cyc = cycles(edges)
        found |= bool(cyc)
        if only_cycles and not cyc:
            continue
        longest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
        print(f"{name}: {len(edges)} modules, {sum(sizes.values())} lines without tests")
        for c in cyc:
            print(f"  cycle: {' <-> '.join(c)}")
        if not only_cycles:
            print("  longest: " + ", ".join(f"{m} {n}" for m, n in longest))
            if name in CRATES:
                print(f"  public items (pub fn/struct/enum/trait/type/const/static/mod/use): {public_items(Path(CRATES[name]))}")
    return 1 if (only_cycles and found) else 0


if __name__ == "__main__":
    sys.exit(main())
