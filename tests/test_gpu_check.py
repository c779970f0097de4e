"""``scripts/gpu_check.py --smoke-cpu``: the GPU check's benchmark code, run on CPU with a small model,
so the script that waits for a GPU machine cannot break unnoticed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_runs_on_cpu():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--smoke-cpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    checks = {r["check"]: r for r in rows}
    assert checks["summary"] == {"check": "summary", "ok": True, "failed": []}
    assert len(checks) == 4 and all(r["ok"] for r in rows)  # rollout, train, colocated cycle, summary
    rollout = next(r for name, r in checks.items() if name.startswith("rollout"))
    assert rollout["engine_tok_s"] > 0 and rollout["hf_generate_tok_s"] > 0
    cycle = next(r for name, r in checks.items() if name.startswith("colocated"))
    assert 0 <= cycle["logprob_abs_diff_mean"] < 0.05  # bf16 trainer vs bf16 engine on the same weights
