"""``rlvr eval``: evaluate a checkpoint on every ``--eval-prompt-data`` set, no training."""

from __future__ import annotations

from rlvr.build import build_engine, load_tokenizer, make_rollout, read_eval_sets
from rlvr.config import Config


def run_eval(cfg: Config) -> dict[str, float]:
    """Evaluate ``--hf-checkpoint`` on every ``--eval-prompt-data`` set (no training)."""
    tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
    engine = build_engine(cfg, cfg.train.hf_checkpoint, tokenizer)
    metrics: dict[str, float] = {}
    try:
        for name, records in read_eval_sets(cfg).items():
            metrics |= make_rollout(cfg, engine, tokenizer, records).evaluate(name, records, cfg.eval)
    finally:
        getattr(engine, "close", lambda: None)()
    return metrics
