"""The policy-freshness guard: after a weight push, proof that the engine samples the policy being trained.

An engine whose weight or adapter sync silently does nothing goes on sampling the old policy (or
the bare base model), and the run only looks slow to learn. After each push the driver has the
engine sample a fixed probe (``PROBE_TEXTS``, ``--policy-freshness-probe-tokens`` new tokens each, at
the rollout temperature, every prompt with a fixed seed of its own, so no engine stream is drawn
from) and the trainer score the tokens the engine sampled. With one token per prompt (the default)
the trainer's side does not wait for the engine's: it computes each prompt's whole next-token
distribution while the engine samples (one forward each side, at the same time), then reads the
sampled token's log-prob from it; with more tokens, or with routing replay (the trainer's forward
needs the engine's experts), it scores the engine's answers after them. Three checks, any of which fails the push:

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rlvr.config.engine_kinds import KINDS, EngineKind
from rlvr.core.errors import TrainingStopped

log = logging.getLogger(__name__)

# Three texts every tokenizer encodes, one token each in SmolLM2's (the tiny models' byte-level ones
# encode them byte by byte). On SmolLM2 at one thread a probe forward costs ~0.06 s for its weights
# plus ~2.5 ms a token (left-padded to the longest prompt in the engine), so the prompts are short.
PROBE_TEXTS = ("The", "def", "Question")
PROBE_SEED = 20_240_611  # the probe's prompt i samples with seed PROBE_SEED + i
NOISE_FLOOR = 1e-7  # float32 rounding of a log-prob: the least gap taken as the engines' noise


class PolicyStale(TrainingStopped):
    """A weight push the engine did not take (the message says which check failed and where)."""


@dataclass
class ProbeAnswer:
    """One probe prompt as the engine answered it, the trainer's log-probs of its tokens and, where
    known, the trainer's log-probs of them under the policy of the last check that passed."""

    token_ids: list[int]
    engine: list[float]
    trainer: list[float]
    version: int
    before: list[float] | None = None


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
    """Why the engine still holds the policy of the previous check, or None. Over the tokens whose
    log-prob under that policy is known (every token of an answer that carries ``before``: the
    one-token probe keeps the trainer's whole distributions; else the tokens each probe prompt's
    two answers share, their common prefix: a seeded sampler need not repeat itself across calls,
    but a token's log-prob depends only on the tokens before it): when the trainer's log-probs of
    them moved by more than ten times ``noise`` (the engine-trainer gap of the previous check), the
    engine's must have followed, i.e. be nearer the trainer's new log-probs than its old ones.

    >>> old = [ProbeAnswer([5, 6], [-1.0, -2.0], [-1.0, -2.0], 1)]
    >>> stale_push([ProbeAnswer([5, 6], [-1.0, -2.0], [-0.8, -2.2], 2)], old, 1e-6) is not None
    True
    >>> stale_push([ProbeAnswer([5, 6], [-0.8, -2.2], [-0.8, -2.2], 2)], old, 1e-6) is None
    True
    >>> stale_push([ProbeAnswer([7], [-3.0], [-2.5], 2, before=[-3.0])], old, 1e-6) is not None  # another token
    True
    """
    triples = []  # (engine, trainer now, trainer at the last good check) of each comparable token
    for i, a in enumerate(answers):
        if a.before is not None:
            triples += zip(a.engine, a.trainer, a.before)
        elif previous is not None and i < len(previous):
            k = common_prefix(a.token_ids, previous[i].token_ids)
            triples += zip(a.engine[:k], a.trainer[:k], previous[i].trainer[:k])
    if not triples:
        return None
    moved, to_now, to_before = (statistics.fmean(abs(t[x] - t[y]) for t in triples) for x, y in ((1, 2), (0, 1), (0, 2)))
    if moved <= 10 * noise or to_before >= to_now:
        return None
    return (f"the push changed nothing: the trainer's log-probs of the probe moved by {moved:.3g} per token since the "
            f"last check, the engine's stayed {to_before:.3g} from where they were ({to_now:.3g} from the trainer's)")


class FreshnessGuard:
    """The checks of the module docstring, run by the driver after a push (``check``)."""

    def __init__(self, mode: str, max_gap: float, probe_tokens: int, temperature: float, prompts: list[list[int]],
                 kind: EngineKind, lora: bool, routing_replay: bool = False):
        self.mode, self.max_gap, self.probe_tokens, self.temperature = mode, max_gap, probe_tokens, temperature
        self.prompts = prompts
        # both sides at once: one token each, and a trainer forward that needs nothing of the engine's
        self.concurrent = probe_tokens == 1 and not routing_replay
        t = KINDS[kind]
        self.where = f"the {kind.value} engine ({t.what}; weights by {t.weight_route}" + (
            f", LoRA adapters by {t.lora_route})" if lora else ")")
        self.previous: list[ProbeAnswer] | None = None  # the answers of the last check that passed
        # the trainer's next-token distributions [prompts, vocab] at the last check that passed (one-token probe)
        self.previous_dist = None
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
        answers, dist = self.probe(rollout, trainer)
        problems = self.problems(answers, version)
        self.engine_version = min(a.version for a in answers)
        gaps = token_gaps(answers)
        if not problems:  # the reference for the next check: the last push known to be in sync
            self.previous, self.noise = answers, max(statistics.fmean(gaps) if gaps else 0.0, NOISE_FLOOR)
            self.previous_dist = dist
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

    def probe(self, rollout, trainer):
        """The engine's answers with the trainer's log-probs of them, and the trainer's next-token
        distributions ``[prompts, vocab]`` (the one-token probe; else None)."""
        if self.concurrent:  # the trainer's side needs nothing of the engine's: both at once
            with ThreadPoolExecutor(1, thread_name_prefix="freshness-probe") as pool:
                asked = pool.submit(rollout.probe, self.prompts, 1, self.temperature, PROBE_SEED)
                dist = trainer.probe_next_log_probs(self.prompts)
                results = self.answered(asked.result())

            def picked(d, i: int) -> list[float] | None:
                return None if d is None else [float(d[i, t]) for t in results[i].token_ids]

            return [ProbeAnswer(list(r.token_ids), list(r.log_probs), picked(dist, i), r.weight_version,
                                before=picked(self.previous_dist, i)) for i, r in enumerate(results)], dist
        results = self.answered(rollout.probe(self.prompts, self.probe_tokens, self.temperature, PROBE_SEED))
        scored = trainer.probe_log_probs([(p, r.token_ids, r.routed_experts) for p, r in zip(self.prompts, results)])
        return [ProbeAnswer(list(r.token_ids), list(r.log_probs), lp, r.weight_version)
                for r, lp in zip(results, scored)], None

    def answered(self, results: list) -> list:
        """``results``, unless one of them is an engine error (then ``PolicyStale``)."""
        for r in results:
            if r.finish_reason == "error":
                raise PolicyStale(f"the freshness probe failed on {self.where}: {r.meta.get('error')}")
        return results

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
                          cfg.rollout.rollout_temperature, prompts, cfg.engine_kind, lora.enabled(cfg.train),
                          cfg.train.use_rollout_routing_replay)
