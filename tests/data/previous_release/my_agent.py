# docs/agents.md's example custom generate function as the previous release printed it (paths
# rlvr.types, ...): tests/test_public_api.py runs it through `rlvr train`. Kept as printed.
import re
from rlvr.agents import context
from rlvr.types import Status


def calculator(expression: str) -> str:
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression):
        return "error: only arithmetic"
    return str(eval(expression))  # noqa: S307 - checked above


async def generate(args, sample, sampling_params):
    ctx = context()
    budget = sampling_params["max_new_tokens"]
    for turn in range(4):
        left = budget - sample.response_length
        if left <= 0:
            sample.status = Status.TRUNCATED
            return sample
        out = await ctx.engine.generate(sample.prompt_ids + sample.response_ids,
                                        dict(sampling_params, max_new_tokens=left, stop=["</calc>"]))
        text = ctx.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        sample.append_segment(out.token_ids, trainable=True, log_probs=out.log_probs,
                              weight_versions=out.weight_versions, text=text)
        if out.finish_reason == "abort":
            sample.status = Status.ABORTED  # regenerated from the prompt later
            return sample
        m = re.search(r"<calc>(.*?)</calc>", text, re.S)
        if m is None:  # a final answer
            sample.status = Status.TRUNCATED if out.finish_reason == "length" else Status.COMPLETED
            return sample
        obs_text, obs_ids = ctx.turns.observation_ids(
            [{"role": "tool", "content": calculator(m.group(1))}], out.token_ids)
        sample.append_segment(obs_ids, trainable=False, text=obs_text)
    sample.status = Status.TRUNCATED
    return sample
