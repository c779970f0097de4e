"""Peak memory of a training step with the exact token-level KL (``--kl-loss-type token_level_kl``)
against the sampled-token estimator ``low_var_kl``, and with the output layer chunked or not.

The demo's tiny model shape with a 32768-token vocabulary (what makes the full distribution
matter), a KL loss to a reference model, one rollout of 8 samples x (100 prompt + 412 response)
tokens in one micro-batch (``--use-dynamic-batch-size --max-tokens-per-gpu 4096``). Each mode runs in its own subprocess:
one ``train`` to allocate AdamW's state, then the
peak-RSS counter is reset (``/proc/self/clear_refs``) and a second ``train`` (reference forward,
p0 forward, one step) is measured. Reported: RSS before, the peak, and the difference.

    python benchmarks/token_kl_memory.py

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
VOCAB = 32768
ONE_CHUNK = 1 << 30  # more rows than any micro-batch holds: the whole micro-batch in one chunk (-1 picks by vocabulary)
MODES = [("low_var_kl", 512), ("token_level_kl", 512), ("token_level_kl", ONE_CHUNK)]


def child(model: str, kl_type: str, chunk: int) -> None:
    from common import set_threads

    set_threads(1)
    from rlvr.algo import AlgoConfig
    from rlvr.config import TrainConfig
    from rlvr.train.memory import peak_memory_gb, reset_peak_memory
    from rlvr.train.trainer import Trainer
    from rlvr.core.types import Sample
    from train_memory import rss_gb

    rng = random.Random(0)
    samples = []
    for _ in range(2):
        prompt = [rng.randrange(VOCAB) for _ in range(100)]
        for j in range(4):
            resp = [rng.randrange(VOCAB) for _ in range(412)]
            samples.append(Sample("", prompt, response_ids=resp, loss_mask=[1] * 412, rollout_log_probs=[-10.0] * 412,
                                  reward=float(j % 2)))
    cfg = TrainConfig(hf_checkpoint=model, lr=1e-5, log_probs_chunk_size=chunk, use_dynamic_batch_size=True,
                      max_tokens_per_gpu=4096)
    algo = AlgoConfig(use_kl_loss=True, kl_loss_coef=0.01, kl_loss_type=kl_type)
    trainer = Trainer(cfg, algo, n_samples_per_prompt=4)
    trainer.train(0, samples)  # allocates the optimizer state
    before = rss_gb()
    reset_peak_memory()
    metrics = trainer.train(1, samples)
    print("RESULT " + json.dumps({"before_gb": before, "peak_gb": peak_memory_gb(), "kl": metrics["train/kl_loss"],
                                  "train_time": metrics["perf/train_time"]}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    from common import MODELS

    from rlvr.models.tiny import build_tiny_model

    from transformers import AutoConfig, AutoModelForCausalLM

    model = build_tiny_model(Path(tempfile.mkdtemp(prefix="rlvr-klmem-")) / "m", max_position_embeddings=1024,
                             **MODELS["tiny"])
    config = AutoConfig.from_pretrained(model)
    config.vocab_size = VOCAB  # a real vocabulary's size: the tiny tokenizer is not used here
    AutoModelForCausalLM.from_config(config).save_pretrained(model)
    for kl_type, chunk in MODES:
        proc = subprocess.run([sys.executable, __file__, "--child", str(model), kl_type, str(chunk)],
                              capture_output=True, text=True)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            sys.exit(proc.stderr[-3000:])
        r = json.loads(line[0].split(" ", 1)[1])
        print(json.dumps({"bench": "token_kl_memory", "kl_loss_type": kl_type, "log_probs_chunk_size": chunk,
                          "vocab": VOCAB, "response_tokens": 8 * 412, "max_tokens_per_gpu": 4096,
                          "rss_before_gb": round(r["before_gb"], 3),
                          "peak_rss_gb": round(r["peak_gb"], 3), "step_gb": round(r["peak_gb"] - r["before_gb"], 3),
                          "kl_loss": round(r["kl"], 5), "train_time_s": round(r["train_time"], 2)}), flush=True)


if __name__ == "__main__":
    main()
