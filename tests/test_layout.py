"""Size budgets of the code that must read top to bottom (STYLE point 12, issue 14)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 60


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


def test_no_function_over_60_lines_in_train_and_loop():
    paths = sorted((ROOT / "rlvr" / "train").glob("*.py")) + [ROOT / "rlvr" / "loop.py"]
    assert len(paths) > 5
    assert _long_functions(paths, MAX_FUNCTION_LINES) == []


def test_the_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    long = tmp_path / "long.py"
    long.write_text(f"def f():\n{body}\n")
    assert _long_functions([long], MAX_FUNCTION_LINES, tmp_path) == ["long.py:1 f (61 lines)"]
    assert _long_functions([long], 61, tmp_path) == []
