"""Supervised bootstrap (``rlvr sft``): negative log-likelihood on each prompt's label as the
response, on the same trainer (packing, micro-batching, optimizer, schedule) as RL."""

from __future__ import annotations

import time
from pathlib import Path

from rlvr.build import load_tokenizer, open_training_data, save_hf
from rlvr.config import Config
from rlvr.data.dataset import DataSource, PromptRecord, render_prompt
from rlvr.observe import ConsoleProgress, MetricsLogger
from rlvr.observe.run_files import prepare_run_dir
from rlvr.train.trainer import Trainer
from rlvr.types import Sample

SFT_LOG_EVERY = 50  # SFT steps are short: one console line per 50 (metrics.jsonl has every step)


def run_sft(cfg: Config, out_dir: str | Path, console: bool = True) -> Path:
    """Supervised bootstrap: ``--num-rollout`` steps of NLL on ``label`` as the response.

    Each step takes ``--rollout-batch-size`` prompts; the response is the label text followed
    by the EOS token. Writes a plain HF checkpoint to ``out_dir``.
    """
    d = cfg.data
    run_dir = prepare_run_dir(cfg.run.output_dir)
    cfg.save_yaml(run_dir / "config.yaml")
    tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
    source = DataSource(open_training_data(cfg, tokenizer), seed=d.rollout_seed)
    trainer = Trainer(cfg.train, cfg.algo, temperature=1.0, total_steps=cfg.run.num_rollout)

    def to_sample(r: PromptRecord) -> Sample:
        text = render_prompt(r.prompt, tokenizer, d.apply_chat_template, d.chat_template_kwargs())
        response = tokenizer(str(r.label), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return Sample(text, tokenizer(text, add_special_tokens=False)["input_ids"], label=r.label,
                      response_ids=response, loss_mask=[1] * len(response))

    with MetricsLogger(run_dir, use_tensorboard=cfg.run.use_tensorboard) as logger, ConsoleProgress(
        cfg.run.num_rollout, enabled=console
    ) as progress:
        for step in range(cfg.run.num_rollout):
            t0 = time.perf_counter()
            metrics = trainer.train_sft([to_sample(r) for r in source.next_prompts(cfg.rollout.rollout_batch_size)])
            metrics["perf/train_time"] = time.perf_counter() - t0
            logger.log(metrics, "train/step", trainer.step)
            last = step + 1 == cfg.run.num_rollout
            progress.advance(step, metrics, show=step % SFT_LOG_EVERY == 0 or last)
            if cfg.run.save_interval and (step + 1) % cfg.run.save_interval == 0 and not last:
                save_hf(trainer.model, tokenizer, Path(out_dir) / f"step_{step + 1:06d}")
    save_hf(trainer.model, tokenizer, out_dir)
    return Path(out_dir)
