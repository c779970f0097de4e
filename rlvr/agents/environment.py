"""The environment protocol for non-tool multi-turn tasks (``--environment-path``).

An environment is any object with two methods (sync or async)::

    reset(sample) -> list[dict] | None     # the opening chat messages (None: keep the sample's prompt)
    step(response: str) -> (observation, reward, done)

``observation`` is a string (sent as a ``user`` message) or a list of chat messages. The
built-in loop (``generate_with_environment``) asks the ``--environment-path`` factory for one
environment per sample, then alternates model turns and observations, token-in/token-out
(``ChatTurns``), for at most ``--max-turns`` model turns within ``--rollout-max-response-len``
tokens. The sample's reward is the sum of the step rewards (the configured reward function is
then not called for it), unless ``--rm-type`` names ``environment``: then the grader composes that
sum with rlvr's rewards (``record_reward``). ``metadata["env_rewards"]`` keeps the per-step rewards.
"""

from __future__ import annotations

from typing import Protocol

from rlvr.core.types import Sample, Status


class Environment(Protocol):
    def reset(self, sample: Sample) -> list[dict] | None: ...

    def step(self, response: str) -> tuple[str | list[dict], float, bool]: ...


async def generate_with_environment(args, sample: Sample, sampling_params: dict) -> Sample:
    """``--environment-path``'s loop (module docstring); its settings are the agent's group, ``args`` is unused."""
    from rlvr.agents.agent_context import context
    from rlvr.core.registry import load_function

    env = load_function(context().agent.config.environment_path, "--environment-path")()
    return await run_environment(env, sample, sampling_params)


async def run_environment(env: Environment, sample: Sample, sampling_params: dict) -> Sample:
    """Alternate model turns and ``env``'s observations on ``sample`` (module docstring), inside a
    generate function (``rlvr.agents.context()``)."""
    from rlvr.agents.agent_context import call_maybe_async, context

    ctx = context()
    a = ctx.agent.config
    messages = await call_maybe_async(env.reset, sample)
    if messages is not None:
        sample.prompt, sample.prompt_ids = ctx.turns.prompt_ids(messages)
    budget, rewards, status = sampling_params["max_new_tokens"], [], Status.COMPLETED
    for turn in range(a.turns_limit):
        left = budget - sample.response_length
        if left <= 0:
            status = Status.TRUNCATED
            break
        out = await ctx.engine.generate(sample.prompt_ids + sample.response_ids, dict(sampling_params, max_new_tokens=left))
        text = ctx.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        sample.append_segment(out.token_ids, trainable=True, log_probs=out.log_probs,
                              weight_versions=out.weight_versions, text=text)
        if out.finish_reason in ("abort", "error"):
            status = Status.ABORTED if out.finish_reason == "abort" else Status.FAILED
            break
        obs, reward, done = await call_maybe_async(env.step, text)
        rewards.append(float(reward))
        if done:
            break
        if turn == a.turns_limit - 1:
            status = Status.TRUNCATED
            break
        msgs = [{"role": "user", "content": obs}] if isinstance(obs, str) else list(obs)
        obs_text, obs_ids = ctx.turns.observation_ids(msgs, out.token_ids)
        if len(obs_ids) >= budget - sample.response_length:
            status = Status.TRUNCATED
            break
        sample.append_segment(obs_ids, trainable=False, text=obs_text)
    sample.status = status
    sample.metadata["env_rewards"] = rewards
    if status != Status.ABORTED:
        record_reward(sample, sum(rewards))
    return sample


def record_reward(sample: Sample, reward: float) -> None:
    """An environment's reward for its episode, inside a generate function: kept in
    ``metadata["environment_reward"]`` (what ``--rm-type environment`` reads), and the sample's
    reward as it is unless the run's reward names ``environment`` -- then the grader scores the
    sample with the composite (``--rm-type environment=0.9,format=0.1``)."""
    from rlvr.agents.agent_context import context

    sample.metadata["environment_reward"] = float(reward)
    rollout = context().rollout
    if rollout is None or "environment" not in rollout.grader.parts:
        sample.reward = float(reward)
