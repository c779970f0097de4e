"""The layout rule of docs/design.md: no import cycle between modules of different folders, lazy
(function-level) imports included. The same check runs as ``python scripts/import_cycles.py``."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_import_cycle_across_folders():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_cycles.py")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 import cycle(s) across folders" in done.stdout


def test_the_checker_finds_a_planted_cycle(tmp_path, monkeypatch):
    """The checker can fail: two modules in different folders that import each other lazily."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import import_cycles
    finally:
        sys.path.pop(0)
    pkg = tmp_path / "rlvr"
    for folder, other in (("a", "b"), ("b", "a")):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / "m.py").write_text(f"def f():\n    from rlvr.{other}.m import f\n")
    (pkg / "__init__.py").write_text("")
    monkeypatch.setattr(import_cycles, "ROOT", pkg)
    assert import_cycles.main([]) == 1
