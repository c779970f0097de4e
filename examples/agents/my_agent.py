# examples/agents/my_agent.py -- run from the directory that holds it:
#   rlvr train --hf-checkpoint MODEL --prompt-data PROMPTS --apply-chat-template --custom-generate-function-path my_agent:generate
import re

from rlvr.api import Status, context


def calculator(expression: str) -> str:
    if not re.fullmatch(r"[0-9+\-*/(). ]+", expression):
        return "error: only arithmetic"
    try:
        return str(eval(expression))  # noqa: S307 - only digits and operators, checked above
    except (SyntaxError, ZeroDivisionError) as e:
        return f"error: {e}"


async def generate(args, sample, sampling_params):
    ctx = context()
    budget = sampling_params["max_new_tokens"]  # the whole response: every turn and observation
    for _turn in range(4):
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
        if len(obs_ids) >= budget - sample.response_length:  # no room for the observation and a reply
            sample.status = Status.TRUNCATED
            return sample
        sample.append_segment(obs_ids, trainable=False, text=obs_text)
    sample.status = Status.TRUNCATED
    return sample
