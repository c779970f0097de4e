"""The policy-freshness guard: after a weight push, proof that the engine samples the policy being trained.

An engine whose weight or adapter sync silently does nothing goes on sampling the old policy (or
the bare base model), and the run only looks slow to learn. After each push the driver has the
engine sample a fixed probe (``PROBE_TEXTS``, ``--policy-freshness-probe-tokens`` new tokens each, at
the rollout temperature, every prompt with a fixed seed of its own, so no engine stream is drawn
from) and the trainer score the tokens the engine sampled. Three checks, any of which fails the push:

- **version**: every probe answer carries the version just pushed;
- **gap**: the mean ``|engine - trainer|`` log-prob over the probe's tokens is at most
  ``--policy-freshness-max-gap`` (an engine holding other weights samples from another distribution);
- **change**: over the probe tokens the engine sampled as at the last good check (each answer's
  common prefix with the old one), where the trainer's log-probs of them moved by more than ten
  times that check's gap, the engine's must be nearer the trainer's new ones than its old ones;
  otherwise the push changed nothing, even if one step was too small for the gap check to show it.

A failed push stops the run (``PolicyStale``, naming the engine kind, its weight route and, with
LoRA, its adapter route) or, with ``--policy-freshness-check warn``, is logged and counted. The
guard's metrics go in the record of the rollout whose push was probed: ``rollout/policy_version_lag``
(the version pushed minus the version the engine reported), ``rollout/policy_freshness_gap`` and
``..._gap_max`` (mean and largest token gap), ``rollout/policy_freshness_failures`` (pushes failed
so far) and ``perf/policy_freshness_time``.

Where weights reach the engine at once (the synchronous loop, ``SyncBatches``) every push is
probed; the ``--async`` and pipelined producers load a push at their next batch boundary, so there
the probe runs where the driver already waits for the weights: before every evaluation.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass

from rlvr.config.engine_kinds import KINDS, EngineKind
from rlvr.core.errors import TrainingStopped

log = logging.getLogger(__name__)

# Three short texts every tokenizer encodes (the tiny models' byte-level ones included).
PROBE_TEXTS = ("Question: what is 2 + 3?\nAnswer:", "The quick brown fox", "def add(a, b):\n    return")
PROBE_SEED = 20_240_611  # the probe's prompt i samples with seed PROBE_SEED + i
NOISE_FLOOR = 1e-7  # float32 rounding of a log-prob: the least gap taken as the engines' noise


class PolicyStale(TrainingStopped):
    """A weight push the engine did not take (the message says which check failed and where)."""


@dataclass
class ProbeAnswer:
    """One probe prompt as the engine answered it, and the trainer's log-probs of its tokens."""

    token_ids: list[int]
    engine: list[float]
    trainer: list[float]
    version: int


def token_gaps(answers: list[ProbeAnswer]) -> list[float]:
    """``|engine - trainer|`` of every probe token.

    >>> token_gaps([ProbeAnswer([5, 6], [-1.0, -2.0], [-1.5, -2.0], 3)])
    [0.5, 0.0]
    """
    return [abs(e - t) for a in answers for e, t in zip(a.engine, a.trainer)]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share.

    >>> common_prefix([1, 2, 3], [1, 2, 4, 5])
    2
    """
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def stale_push(answers: list[ProbeAnswer], previous: list[ProbeAnswer] | None, noise: float) -> str | None:
    """Why the engine still holds the policy of the previous check, or None. Over the tokens each
    probe prompt's two answers share (their common prefix: a seeded sampler need not repeat itself
    across calls, but a token's log-prob depends only on the tokens before it): when the trainer's
    log-probs of them moved
    by more than ten times ``noise`` (the engine-trainer gap of the previous check), the engine's
    must have followed, i.e. be nearer the trainer's new log-probs than its old ones.

    >>> old = [ProbeAnswer([5, 6], [-1.0, -2.0], [-1.0, -2.0], 1)]
    >>> stale_push([ProbeAnswer([5, 6], [-1.0, -2.0], [-0.8, -2.2], 2)], old, 1e-6) is not None
    True
    >>> stale_push([ProbeAnswer([5, 6], [-0.8, -2.2], [-0.8, -2.2], 2)], old, 1e-6) is None
    True
    """
    shared = [(a, p, common_prefix(a.token_ids, p.token_ids)) for a, p in zip(answers, previous or [])]
    shared = [(a, p, k) for a, p, k in shared if k]
    if not shared:
        return None

    def mean_gap(xs, ys) -> float:
        return statistics.fmean(abs(x - y) for x, y in zip(xs, ys))

    engine, now, before = ([x for a, p, k in shared for x in pick(a, p)[:k]] for pick in
                           (lambda a, p: a.engine, lambda a, p: a.trainer, lambda a, p: p.trainer))
    moved, to_now, to_before = mean_gap(now, before), mean_gap(engine, now), mean_gap(engine, before)
    if moved <= 10 * noise or to_before >= to_now:
        return None
    return (f"the push changed nothing: the trainer's log-probs of the probe moved by {moved:.3g} per token since the "
            f"last check, the engine's stayed {to_before:.3g} from where they were ({to_now:.3g} from the trainer's)")


class FreshnessGuard:
    """The checks of the module docstring, run by the driver after a push (``check``)."""

    def __init__(self, mode: str, max_gap: float, probe_tokens: int, temperature: float, prompts: list[list[int]],
                 kind: EngineKind, lora: bool):
        self.mode, self.max_gap, self.probe_tokens, self.temperature = mode, max_gap, probe_tokens, temperature
        self.prompts = prompts
        t = KINDS[kind]
        self.where = f"the {kind.value} engine ({t.what}; weights by {t.weight_route}" + (
            f", LoRA adapters by {t.lora_route})" if lora else ")")
        self.previous: list[ProbeAnswer] | None = None  # the answers of the last check that passed
        self.engine_version: int | None = None  # the version the engine reported at the last probe
        self.noise = NOISE_FLOOR  # the engine-trainer gap of the last probe: how far the two differ when in sync
        self.failures = 0

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def check(self, rollout, trainer, version: int) -> dict[str, float]:
        """Probe the engine behind ``rollout`` (just pushed ``version``) against ``trainer``;
        returns the guard's metrics, raises ``PolicyStale`` on a failed push in ``stop`` mode."""
        t0 = time.perf_counter()
        answers = self.probe(rollout, trainer)
        problems = self.problems(answers, version)
        self.engine_version = min(a.version for a in answers)
        gaps = token_gaps(answers)
        if not problems:  # the reference for the next check: the last push known to be in sync
            self.previous, self.noise = answers, max(statistics.fmean(gaps) if gaps else 0.0, NOISE_FLOOR)
        metrics = {"rollout/policy_version_lag": float(version - self.engine_version),
                   "rollout/policy_freshness_gap": statistics.fmean(gaps) if gaps else 0.0,
                   "rollout/policy_freshness_gap_max": max(gaps, default=0.0)}
        if problems:
            message = f"weight push {version} to {self.where}: " + "; ".join(problems)
            if self.mode == "stop":
                raise PolicyStale(message + " (--policy-freshness-check warn only logs this)")
            self.failures += 1
            log.warning("%s", message)
        return metrics | {"rollout/policy_freshness_failures": float(self.failures),
                          "perf/policy_freshness_time": time.perf_counter() - t0}

    def probe(self, rollout, trainer) -> list[ProbeAnswer]:
        results = rollout.probe(self.prompts, self.probe_tokens, self.temperature, PROBE_SEED)
        for r in results:
            if r.finish_reason == "error":
                raise PolicyStale(f"the freshness probe failed on {self.where}: {r.meta.get('error')}")
        scored = trainer.probe_log_probs([(p, r.token_ids, r.routed_experts) for p, r in zip(self.prompts, results)])
        return [ProbeAnswer(list(r.token_ids), list(r.log_probs), lp, r.weight_version)
                for r, lp in zip(results, scored)]

    def problems(self, answers: list[ProbeAnswer], version: int) -> list[str]:
        out = []
        versions = sorted({a.version for a in answers})
        if versions != [version]:
            out.append(f"the engine answered the probe at weight version(s) {versions}, not {version}")
        gaps = token_gaps(answers)
        if gaps and statistics.fmean(gaps) > self.max_gap:
            out.append(f"its log-probs differ from the trainer's by {statistics.fmean(gaps):.3g} per probe token "
                       f"(max {max(gaps):.3g}; --policy-freshness-max-gap {self.max_gap:g})")
        stale = stale_push(answers, self.previous, self.noise)
        if stale:
            out.append(stale)
        return out


def freshness_guard(cfg, tokenizer) -> FreshnessGuard:
    """The guard a ``Config`` asks for (its ``engine`` group's ``--policy-freshness-*``), the probe's
    texts encoded with the run's tokenizer."""
    from rlvr.train import lora

    e = cfg.engine
    prompts = [list(tokenizer.encode(text)) for text in PROBE_TEXTS]
    return FreshnessGuard(e.policy_freshness_check, e.policy_freshness_max_gap, e.policy_freshness_probe_tokens,
                          cfg.rollout.rollout_temperature, prompts, cfg.engine_kind, lora.enabled(cfg.train))
