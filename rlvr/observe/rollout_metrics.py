"""The rollout's metrics: what ``Rollout`` logs under ``rollout/`` for each batch and under
``eval/<name>/`` for each held-out set (slime's names: ``raw_reward``, ``response_len/*``,
``truncated_ratio``, ``zero_std_ratio``, ``passrate/pass@k``), with the per-source, multi-turn and
DCPO statistics where the samples carry them.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter

from rlvr.core.types import Sample, Status
from rlvr.observe.metrics import compute_statistics


def rollout_metrics(samples: list[Sample], n: int, prefix: str) -> dict[str, float]:
    """Reward, length, truncation and group statistics of a list of samples."""
    rewards = [s.scalar_reward() for s in samples]
    lengths = [s.response_length for s in samples]
    groups = [rewards[i : i + n] for i in range(0, len(rewards), n)]
    m = {
        "raw_reward": statistics.fmean(rewards),
        # Fully correct responses (unshaped reward 1.0): the accuracy of 0/1 verifiers.
        "accuracy": statistics.fmean(float(_score(s) >= 1.0) for s in samples),
        **{f"response_len/{k}": v for k, v in compute_statistics(lengths).items()},  # mean/median/max/min
        "truncated_ratio": sum(s.status == Status.TRUNCATED for s in samples) / len(samples),
        "reward_errors": float(sum("reward_error" in s.metadata for s in samples)),
    }
    extras: dict[str, list[float]] = {}
    for s in samples:
        if isinstance(s.reward, dict):
            for k, v in s.reward.items():
                if k != "score" and isinstance(v, (int, float)):  # bools count as 0/1
                    extras.setdefault(k, []).append(float(v))
    for k, values in extras.items():
        m[f"reward/{k}"] = statistics.fmean(values)
    if n > 1:
        m["zero_std_ratio"] = sum(len(set(g)) == 1 for g in groups) / len(groups)
    m |= source_metrics(samples)
    m |= task_metrics(samples, n)
    m |= turn_metrics(samples)
    m |= dcpo_metrics(samples)
    return {prefix + k: v for k, v in m.items()}


def pass_rates(rewards: list[float], n: int) -> dict[str, float]:
    """slime's ``--log-passrate``: unbiased pass@k (Chen et al. 2021, eq. 1) for k = 1, 2, 4, ... <= n,
    averaged over the groups of ``n`` consecutive rewards; a response passes when its reward is 1.

    >>> pass_rates([1.0, 0.0, 0.0, 0.0], 4)
    {'pass@1': 0.25, 'pass@2': 0.5, 'pass@4': 1.0}
    """
    if n < 2:
        return {}
    groups = [rewards[i : i + n] for i in range(0, len(rewards), n)]
    out = {}
    for k in [2**i for i in range(n.bit_length()) if 2**i <= n]:
        per_group = []
        for g in groups:
            wrong = sum(r != 1.0 for r in g)  # 1 - C(wrong, k) / C(n, k)
            per_group.append(1.0 - math.comb(wrong, k) / math.comb(len(g), k))
        out[f"pass@{k}"] = statistics.fmean(per_group)
    return out


def dcpo_metrics(samples: list[Sample]) -> dict[str, float]:
    """DCPO's own metrics (prefix ``dcpo/`` on the rollout side, under ``rollout/``
    or ``eval/<name>/``) for rewards carrying a stated ``confidence`` (``--rm-type math_confidence``
    / ``dcpo``): accuracy, confidence, the share that stated one, calibration error |acc - conf|
    and the Brier score (acc - conf)^2; ``{}`` otherwise.

    >>> from rlvr.core.types import Sample
    >>> s = [Sample("p", [1], reward={"score": 1.0, "confidence": 0.8, "confidence_char_pos": 3}),
    ...      Sample("p", [1], reward={"score": 0.0, "confidence": 0.0, "confidence_char_pos": -1})]
    >>> {k: round(v, 3) for k, v in dcpo_metrics(s).items()}["dcpo/brier"]
    0.02
    """
    rated = [s for s in samples if isinstance(s.reward, dict) and "confidence" in s.reward]
    if not rated:
        return {}
    acc = [_score(s) for s in rated]
    conf = [float(s.reward["confidence"]) for s in rated]
    return {"dcpo/accuracy": statistics.fmean(acc), "dcpo/confidence": statistics.fmean(conf),
            "dcpo/has_confidence": statistics.fmean(float(s.reward.get("confidence_char_pos", 0) >= 0) for s in rated),
            "dcpo/calibration_error": statistics.fmean(abs(a - c) for a, c in zip(acc, conf)),
            "dcpo/brier": statistics.fmean((a - c) ** 2 for a, c in zip(acc, conf))}


def turn_metrics(samples: list[Sample]) -> dict[str, float]:
    """Multi-turn statistics, for samples whose metadata records ``turns`` or ``agent_error``
    (``rlvr.agents``): turns, tool calls and tool errors (and per-tool counts), samples whose
    generate function failed, and the share of response tokens with loss mask 0 (observations,
    tool results); ``{}`` for single-turn rollouts."""
    multi = [s for s in samples if "turns" in s.metadata]
    failed = sum("agent_error" in s.metadata for s in samples)
    if not multi and not failed:
        return {}
    tokens = sum(s.response_length for s in samples)
    m = {"agent_errors": float(failed),
         "masked_token_ratio": sum(s.response_length - sum(s.loss_mask) for s in samples) / max(tokens, 1)}
    if not multi:
        return m
    turns = [s.metadata["turns"] for s in multi]
    m |= {"turns/mean": statistics.fmean(turns), "turns/max": float(max(turns)),
          "tool_calls/mean": statistics.fmean(s.metadata.get("tool_calls", 0) for s in multi),
          "tool_errors": float(sum(s.metadata.get("tool_errors", 0) for s in multi))}
    per_tool: dict[str, int] = {}
    for s in multi:
        for name, count in s.metadata.get("tool_counts", {}).items():
            per_tool[name] = per_tool.get(name, 0) + count
    m |= {f"tool_calls/{name}": float(c) for name, c in sorted(per_tool.items())}
    return m


def source_metrics(samples: list[Sample]) -> dict[str, float]:
    """Per-source statistics, ``<source>/raw_reward`` etc., for samples whose prompt metadata
    carries ``source_name`` (a mixed dataset); ``{}`` when none does.

    >>> from rlvr.core.types import Sample
    >>> s = [Sample("p", [1], metadata={"source_name": "gsm8k"}, reward=1.0, response_ids=[5, 6]),
    ...      Sample("p", [1], metadata={"source_name": "math"}, reward=0.0, response_ids=[5])]
    >>> source_metrics(s)["gsm8k/raw_reward"], source_metrics(s)["math/response_len/mean"]
    (1.0, 1.0)
    """
    by_source: dict[str, list[Sample]] = {}
    for s in samples:
        if s.metadata.get("source_name") is not None:
            by_source.setdefault(str(s.metadata["source_name"]), []).append(s)
    m: dict[str, float] = {}
    for source, group in sorted(by_source.items()):
        m[f"{source}/raw_reward"] = statistics.fmean(s.scalar_reward() for s in group)
        m[f"{source}/response_len/mean"] = statistics.fmean(s.response_length for s in group)
        m[f"{source}/truncated_ratio"] = sum(s.status == Status.TRUNCATED for s in group) / len(group)
        m[f"{source}/count"] = float(len(group))
    return m


def task_metrics(samples: list[Sample], n: int) -> dict[str, float]:
    """Per-task statistics for samples whose metadata names a ``task`` (a reasoning-gym mix, or
    any dataset that writes one): ``raw_reward/<task>``, ``accuracy/<task>`` (share of reward 1)
    and, for groups of ``n`` > 1, ``passrate/<task>/pass@k`` over that task's groups; ``{}``
    when no sample names a task. A group's samples share a prompt, hence a task.

    Two shares tell a learned task from a learned constant: ``reply_share/<task>``, the share of
    the task's samples that give its most common reply (stripped text), and, when every sample has
    a label, ``label_share/<task>``, the share of its most common label: the accuracy that always
    giving that label would score. An accuracy at ``label_share`` with ``reply_share`` 1 is one
    answer to every question.

    >>> from rlvr.core.types import Sample
    >>> s = [Sample("p", [1], metadata={"task": "gcd"}, reward=r) for r in (1.0, 0.0)]
    >>> s += [Sample("p", [1], metadata={"task": "products"}, reward=r) for r in (0.0, 0.0)]
    >>> m = task_metrics(s, 2)
    >>> m["raw_reward/gcd"], m["passrate/gcd/pass@2"], m["accuracy/products"]
    (0.5, 1.0, 0.0)
    >>> yes = [Sample("p", [1], label=a, response=" Yes", metadata={"task": "syllogism"}, reward=float(a == "Yes"))
    ...        for a in ("Yes", "Yes", "Yes", "No")]
    >>> m = task_metrics(yes, 1)
    >>> m["accuracy/syllogism"], m["label_share/syllogism"], m["reply_share/syllogism"]
    (0.75, 0.75, 1.0)
    """
    by_task: dict[str, list[Sample]] = {}
    for s in samples:
        if s.metadata.get("task") is not None:
            by_task.setdefault(str(s.metadata["task"]), []).append(s)
    m: dict[str, float] = {}
    for task, group in sorted(by_task.items()):
        rewards = [s.scalar_reward() for s in group]
        m[f"raw_reward/{task}"] = statistics.fmean(rewards)
        m[f"accuracy/{task}"] = statistics.fmean(float(_score(s) >= 1.0) for s in group)
        m |= {f"passrate/{task}/{k}": v for k, v in pass_rates(rewards, n).items()}
        m[f"reply_share/{task}"] = _top_share([s.response.strip() for s in group])
        if all(s.label is not None for s in group):
            m[f"label_share/{task}"] = _top_share([str(s.label).strip() for s in group])
    return m


def _score(s: Sample) -> float:
    """The sample's unshaped score: ``metadata["score"]``, recorded before reward shaping, else its reward."""
    return float(s.metadata.get("score", s.scalar_reward()))


def _top_share(values: list[str]) -> float:
    """The share of ``values`` equal to the most common one."""
    return Counter(values).most_common(1)[0][1] / len(values)
