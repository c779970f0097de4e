# examples/agents/openai_agent.py -- run from the directory that holds it:
#   rlvr train --hf-checkpoint MODEL --prompt-data PROMPTS --apply-chat-template --custom-generate-function-path openai_agent:generate
import json

import openai

from rlvr.api import Status, context

TOOLS = [{"type": "function", "function": {"name": "multiply", "description": "Multiply two integers.",
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                         "required": ["a", "b"]}}}]


async def generate(args, sample, sampling_params):
    ctx = context()
    client = openai.AsyncOpenAI(base_url=ctx.openai_base_url, api_key="rlvr", max_retries=0)
    messages = ctx.messages(sample)  # the data's chat messages (sample.prompt is already templated)
    for _ in range(4):  # the endpoint stops answering once --rollout-max-response-len is spent
        r = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                 max_tokens=128, temperature=sampling_params["temperature"])
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls or r.choices[0].finish_reason == "length":
            break
        for call in msg.tool_calls:
            try:
                a = json.loads(call.function.arguments)
                result = str(int(a["a"]) * int(a["b"]))
            except (ValueError, KeyError, TypeError) as e:  # the model's arguments are data
                result = json.dumps({"error": f"bad arguments: {e}"})
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    sample.status = Status.TRUNCATED if r.choices[0].finish_reason == "length" else Status.COMPLETED
    return sample  # left empty: filled from the endpoint's recording
