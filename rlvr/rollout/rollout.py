"""The rollout side: prompt groups -> engine requests -> graded samples (DESIGN "Layers").

``Rollout.generate`` takes ``--rollout-batch-size`` prompts from the data source, asks the
engine for ``--n-samples-per-prompt`` responses each, grades every response with the reward
function, and returns a ``RolloutBatch`` whose consecutive ``n`` samples form a group.
``Rollout.evaluate`` runs the same path on a held-out set with the eval sampling settings.

Each prompt group is its own ``engine.generate`` call, all groups in flight at once; a group is
graded (``Grader.grade_group``) the moment its responses are back, so reward time hides behind
the decoding of the other groups. A reward that fails is contained by the grader: the sample gets
``--reward-failure-value``, its metadata records the reason, ``rollout/reward_errors`` counts it,
and the run goes on. Extra numeric fields of dict rewards (and a composite's parts) are logged
as ``rollout/reward/<field>``.

Randomness is keyed by identity: every request's seed is ``request_seed(--seed, the sample's uid
(the prompt's draw number in the run and the sample's index in its group), tokens it already has)``
and eval samples' ``(--seed, set name, prompt position, sample index)``, so the tokens a sample draws
do not depend on the order the groups reach the engine (and every evaluation draws the same
numbers: differences between two evaluations are the policy's, not the draw's). With
``deterministic`` (``--deterministic-mode``) dynamic sampling also decides by index: each round's
groups go to the engine as one call in index order, all finish, are filed in that order, and none
is aborted, so which groups are kept does not depend on which finished first; an evaluation is
one call likewise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import time
from typing import Callable

import torch

from rlvr.algo.shaping import overlong_penalty
from rlvr.config import EvalConfig, RolloutConfig
from rlvr.data.dataset import DataSource, PromptRecord, render_prompt
from rlvr.engine.base import Engine, GenerateRequest, GenerateResult, SamplingParams
from rlvr.engine.sampling import request_seed
from rlvr.observe.rollout_metrics import pass_rates, rollout_metrics
from rlvr.core.types import RolloutBatch, Sample, Status
from rlvr.rewards.grader import Grader

log = logging.getLogger(__name__)

_FINISH_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


@dataclasses.dataclass(frozen=True)
class RolloutPlugins:
    """The user functions a rollout calls, as rlvr calls them (the builders resolve the flags'
    names and paths, and adapt slime-signature functions: ``rlvr.runtime.plugins``)."""

    group_filter: Callable[[list[Sample]], bool] | None = None  # --dynamic-sampling-filter-path
    post_process: Callable[[list[Sample], object], None] | None = None  # --custom-reward-post-process-path
    sample_filter: Callable[[list[list[Sample]]], object] | None = None  # --rollout-sample-filter-path

    def check(self, cfg: RolloutConfig) -> None:
        """A flag that names a function whose callable is missing fails here, not silently later."""
        for flag, path, fn in (("--dynamic-sampling-filter-path", cfg.dynamic_sampling_filter_path, self.group_filter),
                               ("--custom-reward-post-process-path", cfg.custom_reward_post_process_path,
                                self.post_process),
                               ("--rollout-sample-filter-path", cfg.rollout_sample_filter_path, self.sample_filter)):
            if path is not None and fn is None:
                raise ValueError(f"{flag} {path} is set but the Rollout was built without its function: build it "
                                 "with rlvr.runtime.build.make_rollout, or pass plugins=rlvr.runtime.plugins."
                                 "rollout_plugins(cfg)")


class Rollout:
    def __init__(
        self,
        cfg: RolloutConfig,
        engine: Engine,
        tokenizer,
        data_source: DataSource,
        grader: Grader,
        apply_chat_template: bool = False,
        chat_template_kwargs: dict | None = None,
        agent=None,
        seed: int = 0,
        deterministic: bool = False,
        plugins: RolloutPlugins | None = None,
        top_logprobs_num: int = 0,
    ):
        """``plugins``: the user functions the flags name, resolved (``rlvr.runtime.plugins``);
        ``agent``: the custom generate / rollout functions (``rlvr.agents.hooks.Agent``);
        ``top_logprobs_num``: q's top-k the engine returns with every token (--use-score-centering)."""
        self.cfg, self.engine, self.tokenizer = cfg, engine, tokenizer
        self.data_source, self.grader = data_source, grader
        self.seed, self.deterministic = seed, deterministic  # --seed, --deterministic-mode (module docstring)
        self.apply_chat_template, self.chat_template_kwargs = apply_chat_template, chat_template_kwargs
        plugins = plugins or RolloutPlugins()
        plugins.check(cfg)
        self.group_filter, self.post_process, self.sample_filter = (plugins.group_filter, plugins.post_process,
                                                                    plugins.sample_filter)
        self._prompt_cache: dict[str, tuple[str, list[int]]] = {}
        self.agent = agent
        self.top_logprobs_num = top_logprobs_num
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.stop_ids = tuple(dict.fromkeys(eos + list(cfg.rollout_stop_token_ids)))  # --rollout-stop-token-ids
        self.stop = tuple(cfg.rollout_stop)  # --rollout-stop strings

    # ---- what the loop calls (rlvr.runtime.roles.RolloutRole) ----------------------------
    def data_state(self) -> dict:
        return self.data_source.state_dict()

    def load_data_state(self, state: dict) -> None:
        self.data_source.load_state_dict(state)

    def rng_state(self):
        """The engine's sampler state (None for an engine without one: a server keeps its own)."""
        return self.engine.rng_state()

    def set_rng_state(self, state) -> None:
        if state is not None:
            self.engine.set_rng_state(state)

    def health(self) -> list[bool]:
        return [bool(self.engine.health())]

    def generate(self, rollout_id: int) -> RolloutBatch:
        t0 = time.perf_counter()
        cfg = self.cfg
        if self.agent is not None and self.agent.rollout_fn is not None:  # --rollout-function-path
            groups, metrics = self.agent.run_rollout(self, rollout_id, self.data_source)
            return self.make_batch(rollout_id, check_groups(groups, cfg), time.perf_counter() - t0, metrics)
        # Sample groups until enough pass the dynamic-sampling filter (one round without a filter);
        # groups still in flight then are aborted (and buffered with --partial-rollout).
        collect = self._collect_in_order if self.deterministic else self._collect
        kept, dropped, rounds, partial = asyncio.run(collect(self.sampling_params()))
        unfilled = cfg.rollout_batch_size - len(kept)
        if unfilled > 0:  # the batch size is part of the contract: top up with dropped groups, loudly
            log.warning("rollout %d: only %d groups passed the filter in %d rounds; %d dropped groups reused",
                        rollout_id, len(kept), rounds, unfilled)
            kept += dropped[:unfilled]
        if self.group_filter is not None:
            partial["rollout/dynamic_filter/dropped_groups"] = float(len(dropped))
            partial["rollout/dynamic_filter/rounds"] = float(rounds)
            partial["rollout/dynamic_filter/unfilled_groups"] = float(max(unfilled, 0))
            partial |= getattr(self.group_filter, "drain_metrics", dict)()  # a slime filter's drop reasons
        return self.make_batch(rollout_id, kept, time.perf_counter() - t0, partial)

    def make_batch(self, rollout_id: int, groups: list[list[Sample]], elapsed: float,
                   metrics: dict[str, float] | None = None) -> RolloutBatch:
        """The ``RolloutBatch`` of finished, graded ``groups`` (in order): samples indexed,
        rewards post-processed, ``rollout/*`` and ``perf/rollout_*`` metrics (plus ``metrics``)."""
        n = self.cfg.n_samples_per_prompt
        samples = [s for group in groups for s in group]
        if self.agent is not None:  # a generate function failing too often stops the run
            self.agent.check_failures(samples, f"rollout {rollout_id}")
        for i, s in enumerate(samples):
            s.index, s.group_index = i, i // n
        if self.post_process is not None:
            self.post_process(samples, self.tokenizer)
        out = rollout_metrics(samples, n, prefix="rollout/")
        out |= {f"rollout/{k}": v for k, v in self.data_source.observe(samples).items()}  # e.g. curriculum levels
        if self.sample_filter is not None:
            out["rollout/removed_samples"] = float(remove_samples(self.sample_filter, groups))
        if self.cfg.log_passrate:
            out |= {f"passrate/{k}": v for k, v in pass_rates([s.scalar_reward() for s in samples], n).items()}
        out["perf/rollout_time"] = elapsed
        out["perf/rollout_tokens_per_s"] = sum(s.response_length for s in samples) / max(elapsed, 1e-9)
        out |= self.engine.stats()  # e.g. the supervisor's engine restarts
        # Trained at policy version rollout_id: a sample is as stale as its oldest token.
        staleness = [rollout_id - min(s.weight_versions) for s in samples if s.weight_versions]
        if staleness:
            out["rollout/staleness_mean"] = statistics.fmean(staleness)
            out["rollout/staleness_max"] = float(max(staleness))
        return RolloutBatch(rollout_id, samples, n, out | (metrics or {}))

    def sampling_params(self) -> SamplingParams:
        """The training sampling settings (``--rollout-*``)."""
        cfg = self.cfg
        return SamplingParams(temperature=cfg.rollout_temperature, top_p=cfg.rollout_top_p, top_k=cfg.rollout_top_k,
                              max_new_tokens=cfg.rollout_max_response_len, stop_token_ids=self.stop_ids, stop=self.stop,
                              top_logprobs_num=self.top_logprobs_num)

    def evaluate(self, name: str, records: list[PromptRecord], cfg: EvalConfig) -> dict[str, float]:
        """``eval/<name>/score`` (mean reward), ``eval/<name>`` (slime's key), truncated ratio."""
        greedy = cfg.eval_temperature == 0
        params = SamplingParams(
            temperature=cfg.eval_temperature,
            top_p=cfg.eval_top_p if cfg.eval_top_p is not None else 1.0 if greedy else self.cfg.rollout_top_p,
            top_k=cfg.eval_top_k if cfg.eval_top_k is not None else -1 if greedy else self.cfg.rollout_top_k,
            max_new_tokens=cfg.eval_max_response_len or self.cfg.rollout_max_response_len,
            stop_token_ids=self.stop_ids, stop=self.stop,
        )
        if self.agent is not None and self.agent.eval_fn is not None:  # --eval-function-path / --rollout-function-path
            from rlvr.agents.hooks import EvalData

            groups, _ = self.agent.run_rollout(self, None, EvalData(name, records, cfg.n_samples_per_eval_prompt), True)
            samples = [s for g in groups for s in g]
        else:
            samples = self._sample(records, cfg.n_samples_per_eval_prompt, params, shape=False, name=name)
        if self.agent is not None:
            self.agent.check_failures(samples, f"eval set {name}")
        k = cfg.n_samples_per_eval_prompt
        m = rollout_metrics(samples, k, prefix=f"eval/{name}/")
        m[f"eval/{name}/score"] = m.pop(f"eval/{name}/raw_reward")
        m[f"eval/{name}"] = m[f"eval/{name}/score"]
        for key in [k for k in m if k.startswith(f"eval/{name}/raw_reward/")]:  # per task: eval/<name>/<task>
            m[f"eval/{name}/{key.rsplit('/', 1)[1]}"] = m.pop(key)
        m[f"eval/{name}-truncated_ratio"] = m[f"eval/{name}/truncated_ratio"]  # slime's name for it
        if self.cfg.log_passrate:  # slime: eval/<name>-pass@k
            m |= {f"eval/{name}-{k}": v for k, v in pass_rates([s.scalar_reward() for s in samples], k).items()}
        if k > 1:
            groups = [samples[i : i + k] for i in range(0, len(samples), k)]
            m[f"eval/{name}/pass@{k}"] = sum(any(s.scalar_reward() > 0 for s in g) for g in groups) / len(groups)
        return m

    def update_weights(self, named_tensors, version: int) -> None:
        self.engine.update_weights(named_tensors, version)

    def probe(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, seed: int) -> list[GenerateResult]:
        """The engine's answers to the policy-freshness probe (``rlvr.runtime.freshness``): each prompt
        sampled ``max_new_tokens`` tokens at ``temperature`` with seed ``seed + i``, no stop token."""
        requests = [GenerateRequest(list(p), SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                                                            seed=seed + i), rid=f"freshness-probe-{i}")
                    for i, p in enumerate(prompts)]
        return asyncio.run(self.engine.generate(requests))

    # ---- internals -------------------------------------------------------------------------
    def _encode(self, record: PromptRecord) -> tuple[str, list[int]]:
        key = repr(record.prompt)
        if key not in self._prompt_cache:
            text = render_prompt(record.prompt, self.tokenizer, self.apply_chat_template, self.chat_template_kwargs)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._prompt_cache[key] = (text, ids)
        return self._prompt_cache[key]

    def _sample(
        self, records: list[PromptRecord], n: int, params: SamplingParams, shape: bool = True, name: str = "eval"
    ) -> list[Sample]:
        """``n`` graded samples per record; ``shape`` applies reward shaping (training only). The
        samples' uids ``eval:<name>:<g>/<j>`` (not drawn from the data source) key their seeds."""
        groups = [self.new_group(record, g, n) for g, record in enumerate(records)]
        for g, group in enumerate(groups):
            for j, s in enumerate(group):
                s.uid = f"eval:{name}:{g}/{j}"
        asyncio.run(self._run_groups(groups, params, shape))
        return [s for group in groups for s in group]

    def new_group(self, record: PromptRecord, g: int, n: int, draw: int | None = None) -> list[Sample]:
        """``n`` unsampled samples of ``record``, group ``g`` of its rollout; ``draw`` (the record's
        position in the data source's stream) makes their ``uid``s, unique in the run."""
        text, ids = self._encode(record)
        metadata = dict(record.metadata)
        if self.agent is not None:  # what context().messages(sample) gives a multi-turn agent
            metadata["prompt_messages"] = record.prompt if isinstance(record.prompt, list) else \
                [{"role": "user", "content": record.prompt}]
        return [
            Sample(prompt=text, prompt_ids=list(ids), label=record.label, metadata=dict(metadata),
                   group_index=g, index=g * n + j, prompt_index=record.index,
                   uid=f"{draw}/{j}" if draw is not None else "")
            for j in range(n)
        ]

    def next_groups(self, k: int) -> list[list[Sample]]:
        """``k`` new groups from the data source (each its draw-numbered uids)."""
        first = self.data_source.position
        records = self.data_source.next_prompts(k)
        return [self.new_group(r, i, self.cfg.n_samples_per_prompt, first + i) for i, r in enumerate(records)]

    async def _collect(self, params: SamplingParams) -> tuple[list, list, int, dict[str, float]]:
        """Submit groups (buffered partial groups first, then new prompts) in rounds of
        ``--over-sampling-batch-size`` whenever in flight + kept < ``--rollout-batch-size``
        (slime's ``generate_rollout_async``); file each finished group as kept or dropped by the
        filter; once enough are kept, abort the groups still in flight. Returns (kept, dropped,
        rounds, metrics)."""
        cfg = self.cfg
        target, per_round = cfg.rollout_batch_size, cfg.over_sampling_batch_size or cfg.rollout_batch_size
        kept: list[list[Sample]] = []
        dropped: list[list[Sample]] = []
        in_flight: dict[asyncio.Task, list[Sample]] = {}
        order: dict[int, int] = {}  # id(group) -> submission order
        rounds, resumed, aborted = 0, 0, 0
        while len(kept) < target:
            if len(in_flight) + len(kept) < target and rounds < cfg.dynamic_sampling_max_rounds:
                rounds += 1
                groups = self.data_source.take_partial(per_round)
                resumed += sum(s.status == Status.ABORTED for g in groups for s in g)
                groups += self.next_groups(per_round - len(groups))
                for group in groups:
                    in_flight[asyncio.create_task(self.run_group(group, params, True))] = group
                    order[id(group)] = len(order)
            if not in_flight:
                break
            done, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                group = in_flight.pop(task)
                task.result()  # an engine failure of the whole call propagates
                if any(s.status == Status.ABORTED for s in group):  # aborted by someone else
                    aborted += sum(s.status == Status.ABORTED for s in group)
                    (self.data_source.add_partial([group]) if cfg.partial_rollout else dropped.append(group))
                elif len(kept) < target and (self.group_filter is None or self.group_filter(group)):
                    kept.append(group)
                    kept.sort(key=lambda g: order[id(g)])  # submission order, not finishing order: reproducible
                else:
                    dropped.append(group)
        if in_flight:  # enough groups: stop the rest (slime aborts the remaining requests too)
            self.engine.abort()
            await asyncio.gather(*in_flight)
            leftover = list(in_flight.values())
            aborted += sum(s.status == Status.ABORTED for g in leftover for s in g)
            partial = [g for g in leftover if any(s.status == Status.ABORTED for s in g)]
            if cfg.partial_rollout:
                self.data_source.add_partial(partial)
            dropped += [g for g in leftover if g not in partial]
        return kept, dropped, rounds, self._collect_metrics(kept, aborted, resumed)

    async def _collect_in_order(self, params: SamplingParams) -> tuple[list, list, int, dict[str, float]]:
        """``_collect`` decided by index (``--deterministic-mode``): rounds of
        ``--over-sampling-batch-size`` groups run to the end, one round at a time, and are filed in
        submission order; the first ``--rollout-batch-size`` that pass the filter are kept and the
        rest dropped. Nothing is aborted, so the partial-rollout buffer only gives back what it held."""
        cfg = self.cfg
        target, per_round = cfg.rollout_batch_size, cfg.over_sampling_batch_size or cfg.rollout_batch_size
        kept: list[list[Sample]] = []
        dropped: list[list[Sample]] = []
        rounds, resumed, aborted = 0, 0, 0
        while len(kept) < target and rounds < cfg.dynamic_sampling_max_rounds:
            rounds += 1
            groups = self.data_source.take_partial(per_round)
            resumed += sum(s.status == Status.ABORTED for g in groups for s in g)
            groups += self.next_groups(per_round - len(groups))
            await self._run_groups(groups, params, True)
            for group in groups:
                if any(s.status == Status.ABORTED for s in group):  # aborted by someone else
                    aborted += sum(s.status == Status.ABORTED for s in group)
                    (self.data_source.add_partial([group]) if cfg.partial_rollout else dropped.append(group))
                elif len(kept) < target and (self.group_filter is None or self.group_filter(group)):
                    kept.append(group)
                else:
                    dropped.append(group)
        return kept, dropped, rounds, self._collect_metrics(kept, aborted, resumed)

    def _collect_metrics(self, kept: list[list[Sample]], aborted: int, resumed: int) -> dict[str, float]:
        engine_errors = sum("engine_error" in s.metadata for g in kept for s in g)
        if engine_errors:
            log.warning("%d samples of this rollout failed in the engine (status failed)", engine_errors)
        return {"rollout/aborted": float(aborted), "rollout/engine_errors": float(engine_errors),
                "rollout/partial_rollout/resumed": float(resumed),
                "rollout/partial_rollout/buffered_groups": float(len(self.data_source.buffer))}

    async def _run_groups(self, groups: list[list[Sample]], params: SamplingParams, shape: bool) -> None:
        """Generate and grade ``groups``: each its own call, graded as soon as it is back, or with
        ``deterministic`` all in one call in index order, so that the engine's decode schedule
        (rlvr.engine.local.embedded, deterministic mode) is a function of the groups alone."""
        if self.deterministic and not self._agent_generates():
            await self._generate_groups(groups, params)
            await asyncio.gather(*(self._grade_group(group, shape) for group in groups))
        else:
            await asyncio.gather(*(self.run_group(group, params, shape) for group in groups))

    async def run_group(self, group: list[Sample], params: SamplingParams, shape: bool) -> None:
        """Generate one group, then grade it at once: grading overlaps the other groups' decoding.

        A group from the partial-rollout buffer continues its aborted samples (prompt + response
        so far, the remaining length budget); its finished samples are kept as they are."""
        if self._agent_generates():
            await self.agent.generate_group(self, group, params)
        else:
            await self._generate_groups([group], params)
        await self._grade_group(group, shape)

    def _agent_generates(self) -> bool:
        """A per-sample generate function (multi-turn, tools, environment) makes the responses."""
        return self.agent is not None and self.agent.generate_fn is not None

    async def _grade_group(self, group: list[Sample], shape: bool) -> None:
        """Grade a generated group and shape its rewards; a group with an aborted sample is not
        graded (it is unfinished)."""
        if any(s.status == Status.ABORTED for s in group):
            return
        await self.grader.grade_group([s for s in group if s.reward is None])  # an environment may have set it
        for s in group:
            self._shape(s, shape)

    async def _generate_groups(self, groups: list[list[Sample]], params: SamplingParams) -> None:
        """One engine call for every unfinished sample of ``groups``, in order."""
        for s in (s for group in groups for s in group):  # aborted exactly at the length limit: nothing left
            if s.status == Status.ABORTED and s.response_length >= params.max_new_tokens:
                s.status = Status.TRUNCATED
        todo = [s for group in groups for s in group if not s.response_ids or s.status == Status.ABORTED]
        requests = [
            GenerateRequest(s.prompt_ids + s.response_ids,
                            dataclasses.replace(params, max_new_tokens=params.max_new_tokens - s.response_length,
                                                seed=self.sample_seed(s)),
                            rid=s.uid or str(s.index))
            for s in todo
        ]
        results = await self.engine.generate(requests) if requests else []
        for s, r in zip(todo, results, strict=True):
            self._fill(s, r)

    def sample_seed(self, s: Sample) -> int:
        """``s``'s sampling seed: a function of --seed, its uid and the tokens it already has (a
        partial rollout continued after k tokens draws a stream of its own); a sample without a uid
        falls back to its index in the batch."""
        return request_seed(self.seed, s.uid or f"index:{s.index}", s.response_length)

    def _fill(self, s: Sample, r: GenerateResult) -> None:
        """Append the engine's tokens to the sample. A resumed partial sample keeps the tokens it
        already has; with --mask-offpolicy-in-partial-rollout those (an older policy's) get loss
        mask 0, so only the current policy's tokens are trained on. Their
        log-probs stay as sampled: q for the importance corrections."""
        if s.response_ids:
            s.metadata["partial_rollout_resumes"] = s.metadata.get("partial_rollout_resumes", 0) + 1
            if self.cfg.mask_offpolicy_in_partial_rollout:
                s.loss_mask = [0] * s.response_length
        s.response_ids = s.response_ids + list(r.token_ids)
        s.rollout_log_probs = s.rollout_log_probs + list(r.log_probs)
        s.loss_mask = s.loss_mask + [1] * len(r.token_ids)
        s.weight_versions = s.weight_versions + (list(r.weight_versions) or [r.weight_version] * len(r.token_ids))
        s.rollout_topk_token_ids = s.rollout_topk_token_ids + list(r.top_token_ids)
        s.rollout_topk_log_probs = s.rollout_topk_log_probs + list(r.top_log_probs)
        if r.routed_experts is not None:  # R3: the call ran the whole sequence (a resumed prefix included)
            s.rollout_routed_experts = r.routed_experts
        s.status = _FINISH_STATUS.get(r.finish_reason, Status.FAILED)
        s.response = self.tokenizer.decode(s.response_ids, skip_special_tokens=True)
        if r.finish_reason == "error":
            s.metadata["engine_error"] = r.meta.get("error", "")

    def _shape(self, s: Sample, shape: bool) -> None:
        s.metadata["score"] = s.scalar_reward()  # before shaping: what accuracy is measured on
        if shape and self.cfg.overlong_buffer_len:
            penalty = float(overlong_penalty(torch.tensor([s.response_length]), self.cfg.rollout_max_response_len,
                                             self.cfg.overlong_buffer_len, self.cfg.overlong_penalty_factor))
            s.metadata["overlong_penalty"] = penalty
            if isinstance(s.reward, dict):
                s.reward["score"] = float(s.reward["score"]) + penalty
            else:
                s.reward = float(s.reward) + penalty


def remove_samples(sample_filter: Callable[[list[list[Sample]]], object], groups: list[list[Sample]]) -> int:
    """``--rollout-sample-filter-path`` (slime's, adapted: ``sample_filter(groups)``) sets
    ``remove_sample = True`` on samples that must not train; those get loss mask 0 (they stay in
    the batch, so group statistics are unchanged, as in slime). Returns how many were removed."""
    sample_filter(groups)
    removed = 0
    for s in (s for g in groups for s in g):
        if getattr(s, "remove_sample", False):
            s.loss_mask = [0] * s.response_length
            s.metadata["removed_by_sample_filter"] = True
            removed += 1
    return removed


def check_groups(groups: list[list[Sample]], cfg: RolloutConfig) -> list[list[Sample]]:
    """A rollout function's groups, checked against the batch the trainer expects."""
    if len(groups) != cfg.rollout_batch_size or any(len(g) != cfg.n_samples_per_prompt for g in groups):
        raise ValueError(f"--rollout-function-path returned {len(groups)} groups of sizes {sorted({len(g) for g in groups})}; "
                         f"training needs --rollout-batch-size {cfg.rollout_batch_size} groups of "
                         f"--n-samples-per-prompt {cfg.n_samples_per_prompt} samples")
    return groups
