"""The package's size budgets and layout: every module in a package, no long function anywhere."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 50


def _long_functions(paths: list[Path], limit: int, root: Path = ROOT) -> list[str]:
    """``path:line name (n lines)`` of every function longer than ``limit`` lines, def to last line."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_over_50_lines_in_rlvr():
    paths = sorted((ROOT / "rlvr").rglob("*.py"))
    assert len(paths) > 100
    assert _long_functions(paths, MAX_FUNCTION_LINES) == []


def test_every_module_is_in_a_package():
    loose = sorted(p.name for p in (ROOT / "rlvr").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"]


def test_the_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))  # one line over the limit
    long = tmp_path / "long.py"
    long.write_text(f"def f():\n{body}\n")
    assert _long_functions([long], MAX_FUNCTION_LINES, tmp_path) == [f"long.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert _long_functions([long], MAX_FUNCTION_LINES + 1, tmp_path) == []
