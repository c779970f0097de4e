"""The public API (``rlvr.api``) and the bridges of moved paths (``rlvr.core.moved``): every name
the docs and examples import resolves, old paths import with a warning naming the new one, and a
plugin written against the previous release trains through ``rlvr train``."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import rlvr.api
from rlvr.core.moved import MOVED, MovedWarning

ROOT = Path(__file__).resolve().parents[1]
PREVIOUS_PLUGIN = ROOT / "tests" / "data" / "previous_release" / "my_agent.py"


IMPORT = re.compile(r"(?:from rlvr[\w.]* import [\w, ]+|import rlvr[\w.]*)")


def _statements(path: Path) -> list[tuple[int, ast.AST]]:
    """``(line, node)`` of every import in a file: a .py file parsed whole (function-level
    imports included); in a .md file each ``from rlvr... import`` / ``import rlvr...`` anywhere
    (code blocks, tables, prose)."""
    text = path.read_text()
    if path.suffix == ".py":
        return [(getattr(n, "lineno", 0), n) for n in ast.walk(ast.parse(text))]
    return [(text.count("\n", 0, m.start()) + 1, ast.parse(m.group(0).strip(" ,")).body[0])
            for m in IMPORT.finditer(text)]


def documented_imports() -> list[tuple[str, str, str | None]]:
    """``(file:line, module, name or None)`` of every rlvr import in README.md, docs/*.md (but the
    changelog, which names old paths on purpose) and examples/."""
    docs = [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "changelog.md"]
    paths = [ROOT / "README.md", *docs, *sorted((ROOT / "examples").rglob("*.py"))]
    out = []
    for path in paths:
        for line, node in _statements(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rlvr":
                out += [(where, node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                out += [(where, a.name, None) for a in node.names if a.name.split(".")[0] == "rlvr"]
    return out


def test_the_docs_and_examples_import_names_that_exist_at_their_current_paths():
    found = documented_imports()
    assert {("rlvr.api", "Status"), ("rlvr.api", "context")} <= {(m, n) for _, m, n in found}
    missing = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", MovedWarning)  # the docs show current paths, not bridged ones
        for where, module, name in found:
            try:
                mod = importlib.import_module(module)
                if name is not None and not hasattr(mod, name):
                    importlib.import_module(f"{module}.{name}")  # `from pkg import submodule`
            except (ImportError, MovedWarning) as e:
                missing.append(f"{where}: from {module} import {name}: {e}")
    assert missing == []


def test_the_scan_sees_a_wrong_import(tmp_path, monkeypatch):
    """The check above can fail: a name that does not exist is reported."""
    with pytest.raises(ImportError):
        importlib.import_module("rlvr.api.nothing_here")
    with pytest.raises(AttributeError, match="the public names are"):
        rlvr.api.Nothing  # noqa: B018


def test_every_public_name_resolves_and_matches_its_home():
    for name in rlvr.api.__all__:
        value = getattr(rlvr.api, name)
        home = importlib.import_module(rlvr.api._HOMES[name])
        assert value is getattr(home, name), name


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_path_imports_the_new_module_and_warns_naming_it(old):
    new, _ = MOVED[old]
    sys.modules.pop(old, None)  # a fresh import, as a user's process does it
    with pytest.warns(MovedWarning, match=rf"^{re.escape(old)} is deprecated: .*\(the module is {re.escape(new)} now\)"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_an_unknown_old_path_still_fails():
    with pytest.raises(ModuleNotFoundError, match="rlvr.not_a_module"):
        importlib.import_module("rlvr.not_a_module")


@pytest.mark.slow
def test_a_plugin_written_for_the_previous_release_trains_with_a_warning(tiny_qwen2, arith_files, tmp_path):
    """The previous release's docs/agents.md example (``from rlvr.types import Status``), as a
    user's file in the working directory, trains one rollout; the command prints the warning."""
    (tmp_path / "my_agent.py").write_text(PREVIOUS_PLUGIN.read_text())
    train, _ = arith_files
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "rlvr", "train", "--hf-checkpoint", str(tiny_qwen2),
                        "--prompt-data", str(train), "--apply-chat-template",
                        "--custom-generate-function-path", "my_agent:generate", "--rollout-batch-size", "2",
                        "--n-samples-per-prompt", "2", "--rollout-max-response-len", "16", "--num-rollout", "1",
                        "--output-dir", str(out)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "MovedWarning: rlvr.types is deprecated: import Sample, Status from rlvr.api" in r.stderr
    assert "my_agent.py" in r.stderr.split("MovedWarning")[0].splitlines()[-1]  # points at the user's import line
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["train/step"] for row in rows if "train/step" in row] == [1]
