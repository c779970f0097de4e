# examples/agents/my_rollout.py -- run from the directory that holds it:
#   rlvr train --hf-checkpoint MODEL --prompt-data PROMPTS --rollout-function-path my_rollout:generate_rollout
import asyncio

from rlvr.api import context


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    ctx = context()
    params = ctx.rollout.sampling_params()
    if evaluation:
        groups = [ctx.rollout.new_group(r, g, data_source.n_samples_per_prompt)
                  for g, r in enumerate(data_source.records)]
    else:
        groups = ctx.rollout.next_groups(args.rollout.rollout_batch_size)

    async def one(sample):
        out = await ctx.new_handle(sample.uid).generate(sample.prompt_ids, params)
        sample.append_segment(out.token_ids, trainable=True, log_probs=out.log_probs,
                              weight_versions=out.weight_versions,
                              text=ctx.tokenizer.decode(out.token_ids, skip_special_tokens=True))

    async def run():
        await asyncio.gather(*(one(s) for g in groups for s in g))

    asyncio.run(run())
    return groups, {"rollout/my_metric": 1.0}
