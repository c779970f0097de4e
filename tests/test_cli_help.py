"""``--help`` of every command reads only the declarative config: no torch, no implementation
(``rlvr train --help`` took seconds when printing the flags imported the trainer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rlvr.entrypoints.cli import COMMANDS, TINY_ARCHITECTURES

ROOT = Path(__file__).resolve().parents[1]

# What printing help may load of rlvr: the entry points, the declarative config, slime's flag names, core.
ALLOWED = ("rlvr.entrypoints", "rlvr.config", "rlvr.compat", "rlvr.core", "rlvr.data.arith", "rlvr.data.chat_arith")

HELP_ALL = """
import contextlib, io, json, runpy, sys
from rlvr.entrypoints.cli import COMMANDS, main
out = {}
for argv in [[c, "--help"] for c in COMMANDS if c != "agents"] + [["agents", "check", "--help"], ["--help"]]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main(argv)
        except SystemExit:
            pass
    out[" ".join(argv)] = len(buf.getvalue())
for module in ("rlvr.train", "rlvr.export_hf"):  # the slime-style commands
    sys.argv = [module, "--help"]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_module(module, run_name="__main__")
        except SystemExit:
            pass
print(json.dumps({"printed": out, "modules": sorted(sys.modules)}))
"""


def test_every_commands_help_imports_no_torch_and_no_implementation():
    r = subprocess.run([sys.executable, "-c", HELP_ALL], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.splitlines()[-1])
    assert all(n > 200 for n in seen["printed"].values()), seen["printed"]  # each printed its help
    assert seen["printed"]["train --help"] > 20_000  # every config field
    heavy = [m for m in seen["modules"] if m.split(".")[0] in ("torch", "transformers", "numpy", "aiohttp", "ray")]
    assert heavy == []
    rlvr_modules = [m for m in seen["modules"] if m.startswith("rlvr.")]
    assert [m for m in rlvr_modules if not m.startswith(ALLOWED) and m not in ("rlvr.data", "rlvr.train", "rlvr.export_hf")] == []
    assert "rlvr.entrypoints.cli" in rlvr_modules  # the check saw the command's modules


def test_train_help_lists_the_registered_names_where_it_can_and_says_where_they_are_checked():
    from rlvr.config.parse import make_parser as config_parser
    from rlvr.runtime.configure import make_parser

    def flat(text: str) -> str:
        return " ".join(text.split())

    assert "(registered: cispo, dcpo, grpo" in flat(make_parser().format_help())
    assert "an unknown name is refused at start-up with the list" in flat(config_parser().format_help())


def test_the_declared_tiny_architectures_are_the_models():
    from rlvr.models.tiny import ARCHITECTURES

    assert TINY_ARCHITECTURES == sorted(ARCHITECTURES)
    assert "make-tiny-model" in COMMANDS
