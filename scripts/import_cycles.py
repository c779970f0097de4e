"""Import cycles between rlvr modules, lazy (function-level) imports included.

Prints every strongly connected component of the module import graph that holds more than one
module, marking those that span more than one folder; exits 1 when any spans folders (the layout
rule of docs/design.md: arrows between folders point one way). Imports under
``if TYPE_CHECKING:`` are not run, so they do not count.

    python scripts/import_cycles.py [--all]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "rlvr"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(path: Path, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for name in names:
            while name and name not in modules:  # `from pkg import mod` or `from mod import fn`
                name = name.rpartition(".")[0]
            if name and name != me:
                out.add(name)
    return out


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def folder(module: str, packages: set[str]) -> str:
    return module if module in packages else module.rpartition(".")[0]


def main(argv: list[str]) -> int:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    packages = {module_name(p) for p in paths if p.name == "__init__.py"}
    graph = {module_name(p): imports_of(p, modules) for p in paths}
    bad = 0
    for comp in strongly_connected(graph):
        if len(comp) < 2:
            continue
        folders = {folder(m, packages) for m in comp}
        # A package's __init__ importing its own modules is one folder, not a cycle across folders.
        crosses = len(folders) > 1
        bad += crosses
        if crosses or "--all" in argv:
            print(("ACROSS FOLDERS: " if crosses else "within a folder: ") + " <-> ".join(comp))
    print(f"{len(graph)} modules; {bad} import cycle(s) across folders")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
