"""Peak memory of one training step of the ~20M model at --max-tokens-per-gpu 4096, with and
without --recompute-activations.

Each mode runs in its own subprocess: build the trainer (``--use-dynamic-batch-size
--max-tokens-per-gpu 4096``), take one step to allocate AdamW's state, then reset the peak-RSS
counter (``/proc/self/clear_refs``) and take a second step on a rollout that fills one micro-batch
exactly (8 samples x 512 tokens = 4096). Reported: resident memory before the step, the step's
peak (VmHWM), and the difference (what the step itself needs: activations, gradients, temporaries).

    python benchmarks/train_memory.py

Ends with one JSON line per mode.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def rss_gb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def child(model: str, recompute: bool) -> None:
    from common import set_threads

    set_threads(2)
    from rlvr.algo import AlgoConfig
    from rlvr.config import TrainConfig
    from rlvr.train.memory import peak_memory_gb, reset_peak_memory
    from rlvr.train.trainer import Trainer
    from rlvr.types import Sample

    rng = random.Random(0)
    samples = []
    for g in range(2):
        prompt = [rng.randrange(256) for _ in range(100)]
        for j in range(4):
            resp = [rng.randrange(256) for _ in range(412)]
            samples.append(Sample("", prompt, response_ids=resp, loss_mask=[1] * 412, rollout_log_probs=[-5.5] * 412,
                                  reward=float(j % 2)))
    cfg = TrainConfig(hf_checkpoint=model, lr=1e-5, use_dynamic_batch_size=True, max_tokens_per_gpu=4096,
                      recompute_activations=recompute)
    trainer = Trainer(cfg, AlgoConfig(), n_samples_per_prompt=4)
    trainer.train(0, samples)  # allocates the optimizer state
    before = rss_gb()
    reset_peak_memory()
    metrics = trainer.train(1, samples)
    print("RESULT " + json.dumps({"before_gb": before, "peak_gb": peak_memory_gb(),
                                  "metric_gb": metrics["perf/peak_memory_gb"], "train_time": metrics["perf/train_time"]}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3] == "1")
    from common import model_dir

    model = model_dir("20m", Path(tempfile.mkdtemp(prefix="rlvr-mem-")))
    rows = []
    for recompute in (False, True):
        proc = subprocess.run([sys.executable, __file__, "--child", str(model), str(int(recompute))],
                              capture_output=True, text=True)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            sys.exit(proc.stderr[-3000:])
        r = json.loads(line[0].split(" ", 1)[1])
        row = {"bench": "train_memory", "model": "20m", "max_tokens_per_gpu": 4096,
               "recompute_activations": recompute, "rss_before_gb": round(r["before_gb"], 3),
               "peak_rss_gb": round(r["peak_gb"], 3), "step_gb": round(r["peak_gb"] - r["before_gb"], 3),
               "train_time_s": round(r["train_time"], 2)}
        print(f"recompute={recompute!s:<5}: RSS before {row['rss_before_gb']:.2f} GB, step peak "
              f"{row['peak_rss_gb']:.2f} GB (+{row['step_gb']:.2f} GB), {row['train_time_s']:.1f} s")
        rows.append(row)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
