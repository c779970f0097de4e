"""Every example of docs/agents.md is a file under examples/agents/, printed in the doc verbatim,
and runs as printed: copied alone into a temporary directory, its header's command run there
(MODEL and PROMPTS filled with the tiny model and prompts, plus flags that make the run small)
through a launcher outside that directory, as the ``rlvr`` console script is, with only the
repository on PYTHONPATH: the user's module is found because it is in the working directory."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples" / "agents").glob("*.py"))
SMALL = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "48",
         "--num-rollout", "1"]


def doc_blocks() -> dict[str, str]:
    """{examples/agents/<file>: code} of the doc's python blocks that open with the file's name."""
    text = (ROOT / "docs" / "agents.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return {m.group(1): b for b in blocks if (m := re.match(r"# (examples/agents/\S+\.py)", b))}


def printed_command(path: Path) -> list[str]:
    """The ``rlvr ...`` command in the example's header comment."""
    line = next(ln for ln in path.read_text().splitlines() if ln.startswith("#   rlvr "))
    return shlex.split(line[len("#   "):])


def run_printed(argv: list[str], cwd: Path, launcher_dir: Path) -> subprocess.CompletedProcess:
    launcher = launcher_dir / "rlvr"  # what the console script does; its directory is sys.path[0], not cwd
    launcher.write_text("import sys\nfrom rlvr.entrypoints.cli import main\nsys.exit(main())\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RLVR_WORKDIR", None)
    return subprocess.run([sys.executable, str(launcher), *argv[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_doc_prints_every_example_file_verbatim():
    blocks = doc_blocks()
    assert sorted(blocks) == [f"examples/agents/{p.name}" for p in EXAMPLES]
    for p in EXAMPLES:
        assert blocks[f"examples/agents/{p.name}"] == p.read_text(), f"docs/agents.md differs from {p}"
        assert printed_command(p)[:2] == ["rlvr", "train"]


def _in_temp_dir(example: Path, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / example.name).write_text(example.read_text())
    return work


def _filled(argv: list[str], ckpt: Path, prompts: Path) -> list[str]:
    return [{"MODEL": str(ckpt), "PROMPTS": str(prompts)}.get(a, a) for a in argv]


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_each_example_trains_as_printed_from_a_temp_dir(example, tiny_qwen2, arith_files, tmp_path):
    pytest.importorskip("openai") if example.stem == "openai_agent" else None
    work = _in_temp_dir(example, tmp_path)
    argv = _filled(printed_command(example), tiny_qwen2, arith_files[0]) + SMALL + ["--output-dir", "out"]
    r = run_printed(argv, work, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (work / "out" / "metrics.jsonl").read_text().splitlines()]
    step = next(row for row in rows if "rollout/step" in row)
    assert [row["train/step"] for row in rows if "train/step" in row] == [1]
    if example.stem == "my_rollout":
        assert step["rollout/my_metric"] == 1.0
        return
    assert step["rollout/agent_errors"] == 0 and step["rollout/turns/mean"] >= 1
    shown = [json.loads(line) for line in (work / "out" / "samples.jsonl").read_text().splitlines()]
    for row in shown:  # what a user reads: the segments with their masks, the turns
        assert sum(seg["tokens"] for seg in row["segments"]) <= 48 and row["turns"] >= 1
        assert row["segments"][0]["loss_mask"] == 1 and "text" in row["segments"][0]


@pytest.mark.slow
def test_agents_check_shows_the_segments_of_one_sample(tiny_qwen2, arith_files, tmp_path):
    example = ROOT / "examples" / "agents" / "my_env.py"
    work = _in_temp_dir(example, tmp_path)
    argv = ["rlvr", "agents", "check"] + _filled(printed_command(example)[2:], tiny_qwen2, arith_files[0])
    r = run_printed(argv + ["--rollout-max-response-len", "24", "--check-samples", "2"], work, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert out.count("=== sample 0/") == 2 and "[model  mask=1" in out and "2 of 2 samples ok" in out
    assert "Guess my number" in out  # the environment's opening message is the prompt
