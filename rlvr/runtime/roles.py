"""What the driver (``rlvr.runtime.loop``) asks of the rollout and the trainer: two small declared
protocols, satisfied by the local components (``rlvr.rollout.rollout.Rollout``,
``rlvr.train.trainer.Trainer``, ``rlvr.runtime.colocate.Colocated``) and by their Ray versions
(``rlvr.distributed.RayRollout``, ``RayTrainer``) alike. The driver reaches no further: not into
a rollout's engine or data source, nor a trainer's guard or model (``tests/test_roles.py`` checks
that every implementation has every method).

State a checkpoint keeps crosses as plain data (``data_state`` / ``rng_state``), so the Ray
versions answer with one call to their actor instead of imitating the local objects' attributes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from rlvr.config import EvalConfig
from rlvr.core.types import RolloutBatch, Sample


@runtime_checkable
class RolloutRole(Protocol):
    def generate(self, rollout_id: int) -> RolloutBatch:
        """Rollout ``rollout_id``: sampled, graded, its metrics."""

    def evaluate(self, name: str, records: list, cfg: EvalConfig) -> dict[str, float]:
        """``eval/<name>/*`` of one held-out set."""

    def update_weights(self, weights: Any, version: int) -> None:
        """The trainer's weights (``TrainerRole.weights()``) to every engine, as ``version``."""

    def data_state(self) -> dict:
        """The data source's position (epoch, offset, partial groups), for a checkpoint."""

    def load_data_state(self, state: dict) -> None:
        """Put the data source back where ``data_state`` was taken."""

    def rng_state(self) -> Any:
        """The engines' sampling streams (None: nothing to keep), for a checkpoint."""

    def set_rng_state(self, state: Any) -> None:
        """Restore what ``rng_state`` returned (None: nothing to do)."""

    def health(self) -> list[bool]:
        """One entry per engine: up or not."""

    def probe(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, seed: int) -> list:
        """The engines' answers (``GenerateResult``) to the policy-freshness probe (``rlvr.runtime.freshness``)."""


@runtime_checkable
class TrainerRole(Protocol):
    step: int  # optimizer steps taken (train/step)

    def train(self, rollout_id: int, samples: list[Sample]) -> dict[str, float]:
        """Optimizer step(s) on one rollout's samples; ``train/*`` (and ``perf/*``) metrics."""

    def weights(self) -> Any:
        """The policy's weights as the rollout's ``update_weights`` takes them."""

    def save(self, directory: str | Path, tokenizer=None, extra: dict | None = None) -> Path:
        """A training checkpoint (model, optimizer, trainer state, ``extra``)."""

    def load(self, directory: str | Path) -> dict:
        """Restore a checkpoint ``save`` wrote; returns its ``extra``."""

    def save_hf(self, tokenizer, directory: str | Path) -> Path:
        """The policy as a plain Hugging Face checkpoint (LoRA merged), with ``tokenizer``."""

    def check_bad_steps(self, skipped_path: Callable[[int], str]) -> None:
        """Stop the run (``TrainingStopped``) after too many skipped steps in a row
        (``--max-consecutive-skipped-steps``); ``skipped_path(rollout_id)`` names the kept batch."""

    def probe_log_probs(self, sequences: list[tuple[list[int], list[int], Any]]) -> list[list[float]]:
        """The policy's log-probs of each ``(prompt, response, routed experts or None)``'s response
        tokens (the freshness probe)."""

    def probe_next_log_probs(self, prompts: list[list[int]]) -> Any:
        """The policy's log-probs ``[n, vocab]`` of every next token after each prompt (the
        freshness probe of one token, scored while the engine samples it)."""
