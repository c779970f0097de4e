"""The layer rule of docs/design.md: rlvr's imports point down the declared layers, and no module
imports itself back through others (a cycle), lazy (function-level) imports included. Two rules
about the edges ride along:

* adapters only at the edge: only the modules in ``ADAPTER_USERS`` (the config, which reads
  slime's flag names, the runtime's builders and the entry points) import ``rlvr.compat``;
* components complete when built: no module assigns to an attribute of another package's
  component (``rollout.agent = ...`` outside ``rlvr.rollout``); ``COMPONENTS`` names the
  variables and attributes that hold one (``rollout``, ``trainer``, ...), whatever the chain
  before them (``c.trainer.guard.streak = ...``);
* each component gets its own config group: only the modules in ``WHOLE_CONFIG_USERS`` (the
  config itself, the builders and the Ray start-up, the entry points, the adapters) import the
  whole ``Config`` class at run time; a component imports its group (``AgentConfig``, ...).

``LAYERS`` lists the packages from the top (what a user runs) to the bottom (types and errors).
A module may import any module of its own layer or of a lower one; an import of a higher layer
is an upward arrow. Every module of ``rlvr`` must sit in a declared layer. Imports under
``if TYPE_CHECKING:`` are not run, so they do not count. Prints every upward arrow and every
cycle with the file:line of each import involved; exits 1 when there is any.

    python scripts/import_cycles.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "rlvr"

# top to bottom; packages in one row are peers (they may import each other, without a cycle)
LAYERS: list[list[str]] = [
    ["rlvr.entrypoints", "rlvr.__main__", "rlvr.train.__main__", "rlvr.export_hf", "rlvr.api"],  # the commands (rlvr, and
    # the slime-style python -m rlvr.train / rlvr.export_hf) and their sub-commands
    ["rlvr.runtime", "rlvr.distributed"],  # the driver, builders, batch sources; the same on Ray
    ["rlvr.rollout"],  # prompt groups -> samples: engines, agents, rewards, filters
    ["rlvr.agents", "rlvr.environments", "rlvr.train"],  # multi-turn generation, other packages' environments; the trainer
    ["rlvr.engine", "rlvr.rewards"],  # token generation; verifiers
    ["rlvr.algo", "rlvr.data", "rlvr.models", "rlvr.observe", "rlvr.sandbox"],  # maths, datasets, model code,
    # metrics, the process sandbox (rewards' code runs, agents' Python tool)
    ["rlvr.config"],  # declarative config: fields, groups, parsing
    ["rlvr.compat"],  # other systems' flag names, paths and plugin signatures
    ["rlvr.core"],  # types, errors, registry, small I/O helpers
]
UNLAYERED = {"rlvr"}  # the package itself: a docstring and __version__

ADAPTER = "rlvr.compat"
ADAPTER_USERS = ("rlvr.compat", "rlvr.config", "rlvr.runtime", "rlvr.entrypoints", "rlvr.train.__main__",
                 "rlvr.export_hf")  # the last two: slime-style commands, entry points kept at their slime paths
WHOLE_CONFIG = ("rlvr.config", "rlvr.config.root")  # where ``Config`` is imported from
WHOLE_CONFIG_USERS = ("rlvr.config", "rlvr.runtime", "rlvr.distributed", "rlvr.entrypoints", "rlvr.compat",
                      "rlvr.api", "rlvr.train.__main__", "rlvr.export_hf")
# a name that holds a component -> the package that owns the component's attributes
COMPONENTS = {"rollout": "rlvr.rollout", "trainer": "rlvr.train", "agent": "rlvr.agents", "engine": "rlvr.engine",
              "grader": "rlvr.rewards", "data_source": "rlvr.data", "guard": "rlvr.train"}


def module_name(path: Path, root: Path | None = None) -> str:
    root = ROOT if root is None else root
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str, layers: list[list[str]] = LAYERS) -> int | None:
    """Index of the module's layer (0 = top), None when no declared package holds it."""
    for i, row in enumerate(layers):
        if any(module == p or module.startswith(p + ".") for p in row):
            return i
    return None


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imported_names(node: ast.AST, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            pkg = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(pkg + ([base] if base else []))
        return [f"{base}.{a.name}" for a in node.names] + [base]
    return []


def imports_of(path: Path, modules: set[str], root: Path | None = None) -> dict[str, int]:
    """{imported rlvr module: line of its first import} of one file."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: dict[str, int] = {}
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        for name in _imported_names(node, package):
            while name and name not in modules:  # `from pkg import mod` or `from mod import fn`
                name = name.rpartition(".")[0]
            if name and name != me and name not in out:
                out[name] = node.lineno
    return out


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
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


def violations(root: Path = ROOT, layers: list[list[str]] = LAYERS) -> tuple[list[str], list[str], int]:
    """(upward arrows and unlayered modules, cycles, number of modules), each as printable lines."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = {m: imports_of(p, set(paths), root) for m, p in paths.items()}
    where = {m: str(p.relative_to(root.parent)) for m, p in paths.items()}
    upward = [f"{where[m]}: not in a declared layer (add its package to LAYERS)"
              for m in graph if m not in UNLAYERED and layer_of(m, layers) is None]
    for m, imported in graph.items():
        mine = layer_of(m, layers)
        for other, line in imported.items():
            theirs = layer_of(other, layers)
            if mine is not None and theirs is not None and theirs < mine:
                upward.append(f"{where[m]}:{line}: {m} imports {other}, a higher layer")
    cycles = []
    for comp in strongly_connected(graph):
        if len(comp) > 1:
            edges = [f"{where[a]}:{graph[a][b]} -> {b}" for a in comp for b in comp if b in graph[a]]
            cycles.append("cycle " + " <-> ".join(comp) + "\n    " + "\n    ".join(edges))
    return upward, cycles, len(graph)


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _names_of(node: ast.AST) -> list[str]:
    """``a.b.c`` -> ["a", "b", "c"] (the names of an attribute chain, outermost first)."""
    out = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        out.append(node.id)
    return out[::-1]


def foreign_assignments(path: Path, me: str) -> list[str]:
    """``line: target`` of each assignment in one file to an attribute of a component that
    another package owns (``COMPONENTS``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for t in targets:
            if not isinstance(t, ast.Attribute):
                continue
            chain = _names_of(t.value)
            owner = next((COMPONENTS[n] for n in chain if n in COMPONENTS), None)
            if owner is not None and not _inside(me, owner):
                out.append(f"{node.lineno}: {'.'.join(chain + [t.attr])} (a component of {owner})")
    return out


def whole_config_imports(path: Path) -> list[int]:
    """Lines of one file that import the whole ``Config`` class at run time (``TYPE_CHECKING``
    imports aside)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module in WHOLE_CONFIG and node.lineno not in skip
            and any(a.name == "Config" for a in node.names)]


def edge_violations(root: Path = ROOT) -> list[str]:
    """Imports of ``rlvr.compat`` outside ``ADAPTER_USERS``, of the whole ``Config`` outside
    ``WHOLE_CONFIG_USERS`` and assignments to another package's component, as printable lines
    with file:line."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    out = []
    for m, p in paths.items():
        where = p.relative_to(root.parent)
        if not any(_inside(m, u) for u in ADAPTER_USERS):
            out += [f"{where}:{line}: {m} imports {other}: only {', '.join(ADAPTER_USERS[1:4])} adapt other systems"
                    for other, line in imports_of(p, set(paths), root).items() if _inside(other, ADAPTER)]
        if not any(_inside(m, u) for u in WHOLE_CONFIG_USERS):
            out += [f"{where}:{line}: {m} imports the whole Config: take the config group(s) it reads, "
                    "which the builders (rlvr.runtime.build) pass" for line in whole_config_imports(p)]
        out += [f"{where}:{finding}: set it through the constructor" for finding in foreign_assignments(p, m)]
    return out


def main(argv: list[str]) -> int:
    upward, cycles, n = violations()
    edges = edge_violations()
    for line in upward + cycles + edges:
        print(line)
    print(f"{n} modules; {len(cycles)} import cycle(s); {len(upward)} upward import(s); "
          f"{len(edges)} compat import(s), whole-Config import(s) or foreign assignment(s)")
    return 1 if upward or cycles or edges else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
