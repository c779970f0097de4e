"""``rlvr eval``: evaluate a checkpoint on every ``--eval-prompt-data`` set, no training."""

from __future__ import annotations

from rlvr.runtime.build import build_engine, load_tokenizer, make_rollout, read_eval_sets
from rlvr.config import Config


def evaluate_model(cfg: Config, model, tokenizer, eval_sets: dict) -> dict[str, float]:
    """``eval/<name>/*`` of ``model`` (a module or a checkpoint path) on each eval set, through an
    engine built for the call and closed after it."""
    engine = build_engine(cfg, model, tokenizer)
    metrics: dict[str, float] = {}
    try:
        for name, records in eval_sets.items():
            metrics |= make_rollout(cfg, engine, tokenizer, records).evaluate(name, records, cfg.eval)
    finally:
        getattr(engine, "close", lambda: None)()
    return metrics


def run_eval(cfg: Config) -> dict[str, float]:
    """Evaluate ``--hf-checkpoint`` on every ``--eval-prompt-data`` set (no training)."""
    tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
    return evaluate_model(cfg, cfg.train.hf_checkpoint, tokenizer, read_eval_sets(cfg))
