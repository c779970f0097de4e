"""What a user's hook must be and return, checked where a mistake can be named.

At start-up (``check_hooks``, called by ``rlvr.runtime.configure``): each hook's signature binds
the arguments rlvr will pass, else a ``ConfigError`` naming the flag and the expected signature
(instead of a ``TypeError ... 3 were given`` in the first rollout).

Per sample (``checked_sample``): a generate function returns one ``Sample`` whose masks match its
tokens, with at least one response token (an empty sample has nothing to train), within the
response budget (``--rollout-max-response-len`` counts every segment, observations too: a longer
response is cut to the budget and marked truncated). A violation is the sample's failure.

Failures (``failed_sample``, ``FailureLimit``): a hook that raises, or returns a bad sample, fails
that sample only: its response is dropped (status ``failed``, reward ``--reward-failure-value``,
``metadata["agent_error"]``), the traceback is logged (in full the first time each error is
seen), ``rollout/agent_errors`` counts it, and the run goes on until more than
``--agent-failure-limit`` of one rollout's (or eval set's) samples failed.
"""

from __future__ import annotations

import inspect
import logging
import threading
import traceback

from rlvr.core.errors import ConfigError, TrainingStopped
from rlvr.core.registry import load_function
from rlvr.core.types import Sample, Status

log = logging.getLogger(__name__)

# flag -> (the arguments rlvr passes, as (positional, keyword); the signature a user should write)
SIGNATURES = {
    "--custom-generate-function-path": ((3, {}), "async def generate(args, sample, sampling_params) -> Sample"),
    "--rollout-function-path": ((3, {"evaluation": False}),
                                "def generate_rollout(args, rollout_id, data_source, evaluation=False) -> groups"),
    "--eval-function-path": ((3, {"evaluation": True}),
                             "def generate_rollout(args, rollout_id, data_source, evaluation=False) -> groups"),
    "--environment-path": ((0, {}), "def make_env() -> an object with reset(sample) and step(response)"),
}


def check_signature(fn, flag: str, path: str) -> None:
    """ConfigError naming ``flag`` unless ``fn`` accepts the arguments rlvr calls it with."""
    (n_args, kwargs), expected = SIGNATURES[flag]
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    try:
        sig.bind(*([None] * n_args), **kwargs)
    except TypeError as e:
        raise ConfigError(flag, f"{path} has the signature {getattr(fn, '__name__', path)}{sig}, which cannot take "
                                f"rlvr's call ({e}); write it as: {expected}") from None


def check_hooks(agent_cfg, eval_function_path: str | None = None) -> None:
    """Every hook flag given imports and has a signature rlvr can call."""
    for flag, path in (("--custom-generate-function-path", agent_cfg.custom_generate_function_path),
                       ("--rollout-function-path", agent_cfg.rollout_function_path),
                       ("--eval-function-path", eval_function_path),
                       ("--environment-path", agent_cfg.environment_path)):
        if path is not None:
            check_signature(load_function(path, flag), flag, path)


def hook_name(agent_cfg) -> str:
    """The flag (and path) of the per-sample function, for messages."""
    a = agent_cfg
    if a.custom_generate_function_path:
        return f"--custom-generate-function-path {a.custom_generate_function_path}"
    if a.tools:
        return f"the --tools loop ({a.tools})"
    if a.environment:
        return f"--environment {a.environment}"
    return f"the --environment-path loop ({a.environment_path})"


def reset(s: Sample) -> None:
    """Drop a sample's response (to regenerate it from its prompt, or when its hook failed)."""
    s.response, s.response_ids, s.rollout_log_probs, s.loss_mask, s.weight_versions = "", [], [], [], []
    s.rollout_topk_token_ids, s.rollout_topk_log_probs = [], []
    s.reward, s.status, s.train_metadata = None, Status.COMPLETED, {}
    for k in ("turns", "tool_calls", "tool_errors", "tool_counts", "engine_error", "agent_error", "agent_traceback",
              "cut_tokens"):
        s.metadata.pop(k, None)


# ---- per sample ------------------------------------------------------------------------------------
def checked_sample(out, s: Sample, where: str, budget: int, tokenizer) -> Sample:
    """The sample a generate function returned, checked (module docstring); ValueError / TypeError
    saying what is wrong, which fails the sample."""
    if isinstance(out, list):
        if len(out) != 1:
            raise ValueError(f"{where} returned {len(out)} samples for sample {s.uid or s.index}; rlvr trains groups "
                             "of --n-samples-per-prompt samples, so a generate function returns exactly one sample")
        out = out[0]
    if not isinstance(out, Sample):
        raise TypeError(f"{where} returned {type(out).__name__}, not a Sample: return the sample it was given")
    out.check()
    if out.status == Status.ABORTED:
        return out
    if not out.response_ids:
        raise ValueError(f"{where} returned sample {out.uid or out.index} with no response token: append the "
                         "engine's tokens with sample.append_segment(out.token_ids, trainable=True, ...) (or make "
                         "at least one call on context().openai_base_url)")
    if out.response_length > budget:
        cut_to_budget(out, budget, tokenizer)
    return out


def cut_to_budget(s: Sample, budget: int, tokenizer) -> None:
    """Cut the response to its first ``budget`` tokens (``--rollout-max-response-len``), status
    truncated; ``metadata["cut_tokens"]`` says how many went. The text is decoded again per segment."""
    cut = s.response_length - budget
    log.warning("sample %s: %d response tokens over --rollout-max-response-len %d (observations count too): cut "
                "to the budget, status truncated", s.uid or s.index, cut, budget)
    s.response_ids, s.loss_mask = s.response_ids[:budget], s.loss_mask[:budget]
    s.rollout_log_probs, s.weight_versions = s.rollout_log_probs[:budget], s.weight_versions[:budget]
    s.rollout_topk_token_ids, s.rollout_topk_log_probs = s.rollout_topk_token_ids[:budget], s.rollout_topk_log_probs[:budget]
    s.response = "".join(tokenizer.decode(s.response_ids[a:b], skip_special_tokens=t) for a, b, t in s.segments())
    s.status = Status.TRUNCATED
    s.metadata["cut_tokens"] = cut


# ---- failures --------------------------------------------------------------------------------------
class FailureLog:
    """Marks failed samples and logs their tracebacks (each distinct error in full once)."""

    def __init__(self, where: str, failure_reward: float):
        self.where, self.failure_reward = where, failure_reward
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def fail(self, s: Sample, e: BaseException) -> Sample:
        reset(s)
        error = "".join(traceback.format_exception_only(type(e), e)).strip()
        s.status, s.reward = Status.FAILED, self.failure_reward
        s.metadata["agent_error"] = error
        s.metadata["agent_traceback"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]
        with self._lock:
            first = error not in self._seen
            self._seen.add(error)
        if first:
            log.error("sample %s failed in %s (not trained; counted in rollout/agent_errors):\n%s",
                      s.uid or s.index, self.where, s.metadata["agent_traceback"])
        else:
            log.error("sample %s failed in %s: %s (traceback above)", s.uid or s.index, self.where, error)
        return s


def check_failure_limit(samples: list[Sample], what: str, limit: float, where: str) -> None:
    """TrainingStopped when more than ``limit`` of ``samples`` failed in the hook."""
    failed = [s for s in samples if "agent_error" in s.metadata]
    if samples and len(failed) > limit * len(samples):
        raise TrainingStopped(f"{len(failed)} of {len(samples)} samples of {what} failed in {where} (more than "
                              f"--agent-failure-limit {limit}); the first: {failed[0].metadata['agent_error']} "
                              "(tracebacks in the log above; `rlvr agents check` runs one sample and shows it)")
