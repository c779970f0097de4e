"""The layer rule of docs/design.md, as ``scripts/import_cycles.py`` checks it: imports point down
the declared layers (``LAYERS``) and no module imports itself back through others, lazy
(function-level) imports included."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import import_cycles  # noqa: E402

sys.path.pop(0)


def test_rlvr_has_no_cycle_and_no_upward_import():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_cycles.py")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 import cycle(s); 0 upward import(s)" in done.stdout


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "rlvr"
    for rel, text in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(pkg).parents:
            (pkg / parent / "__init__.py").touch()
        path.write_text(text)
    return pkg


LAYERS = [["rlvr.top"], ["rlvr.low"]]


def test_the_check_finds_a_planted_cycle(tmp_path):
    """Two modules of one layer that import each other lazily."""
    pkg = _plant(tmp_path, {"low/a.py": "def f():\n    from rlvr.low.b import g\n",
                            "low/b.py": "def g():\n    from rlvr.low.a import f\n", "top/m.py": ""})
    upward, cycles, _ = import_cycles.violations(pkg, LAYERS)
    assert upward == [] and len(cycles) == 1
    assert "rlvr.low.a <-> rlvr.low.b" in cycles[0] and "rlvr/low/a.py:2 -> rlvr.low.b" in cycles[0]


def test_the_check_finds_a_planted_upward_import(tmp_path):
    pkg = _plant(tmp_path, {"low/a.py": "import os\n\n\ndef f():\n    from rlvr.top.m import g\n",
                            "top/m.py": "from rlvr.low.a import f\n\n\ndef g():\n    pass\n"})
    upward, cycles, _ = import_cycles.violations(pkg, LAYERS)
    assert upward == ["rlvr/low/a.py:5: rlvr.low.a imports rlvr.top.m, a higher layer"]
    assert len(cycles) == 1  # the upward import closes a cycle with the downward one


def test_the_check_finds_a_module_outside_the_layers(tmp_path):
    pkg = _plant(tmp_path, {"loose.py": "", "low/a.py": ""})
    upward, _, _ = import_cycles.violations(pkg, LAYERS)
    assert upward == ["rlvr/loose.py: not in a declared layer (add its package to LAYERS)"]


@pytest.mark.parametrize("line", ["if TYPE_CHECKING:\n    from rlvr.top.m import g\n"])
def test_type_checking_imports_do_not_count(tmp_path, line):
    pkg = _plant(tmp_path, {"low/a.py": "from typing import TYPE_CHECKING\n" + line, "top/m.py": ""})
    assert import_cycles.violations(pkg, LAYERS)[:2] == ([], [])


def test_the_check_finds_a_compat_import_outside_the_edge_and_a_foreign_assignment(tmp_path):
    """A role package importing ``rlvr.compat`` and a builder patching a rollout after building it
    are each reported with file:line; the config and the runtime may import compat, and a
    package may set its own component's attributes."""
    pkg = _plant(tmp_path, {"compat/slime.py": "X = 1\n",
                            "rollout/rollout.py": "def f():\n    from rlvr.compat.slime import X\n\n\n"
                                                  "def g(rollout):\n    rollout.top_k = 3\n",
                            "config/parse.py": "from rlvr.compat.slime import X\n",
                            "runtime/build.py": "from rlvr.compat import slime\n\n\n"
                                                "def make(c, Rollout):\n    c.rollout.agent = object()\n"
                                                "    self_made = Rollout()\n    self_made.engine_count = 1\n"})
    found = import_cycles.edge_violations(pkg)
    assert len(found) == 2, found
    assert found[0].startswith("rlvr/rollout/rollout.py:2: rlvr.rollout.rollout imports rlvr.compat.slime")
    assert found[1] == ("rlvr/runtime/build.py:5: c.rollout.agent (a component of rlvr.rollout): "
                        "set it through the constructor")


def test_the_check_finds_the_whole_config_imported_by_a_component(tmp_path):
    """A component below the builders importing the whole ``Config`` (at run time) is reported with
    file:line; its own group, a ``TYPE_CHECKING`` import and the builders' imports are not."""
    pkg = _plant(tmp_path, {"config/__init__.py": "class Config:\n    pass\n\n\nclass AgentConfig:\n    pass\n",
                            "agents/hooks.py": "from rlvr.config import AgentConfig\n\n\n"
                                               "def f():\n    from rlvr.config import Config\n",
                            "observe/files.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                "    from rlvr.config.root import Config\n",
                            "runtime/build.py": "from rlvr.config import Config\n",
                            "distributed/actors.py": "from rlvr.config import Config\n"})
    found = import_cycles.edge_violations(pkg)
    assert found == ["rlvr/agents/hooks.py:5: rlvr.agents.hooks imports the whole Config: take the config "
                     "group(s) it reads, which the builders (rlvr.runtime.build) pass"], found
