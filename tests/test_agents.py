"""Multi-turn samples: segment invariants, exact log-probs across turns, masked tool tokens."""

import asyncio

import pytest
import torch

from rlvr.agents.session import EngineHandle
from rlvr.agents.turns import ChatTurns
from rlvr.algo import AlgoConfig
from rlvr.config import TrainConfig
from rlvr.core.errors import ConfigError
from rlvr.train.trainer import Trainer
from rlvr.core.types import Sample


def test_append_segment_keeps_the_invariants_and_names_the_sample():
    s = Sample("p", [1, 2], uid="7/1")
    s.append_segment([5, 6], trainable=True, log_probs=[-0.5, -0.25], weight_versions=[2, 2])
    s.append_segment([9, 9, 9], trainable=False)
    s.append_segment([4], trainable=True, log_probs=[-1.0], weight_versions=[3])
    assert s.loss_mask == [1, 1, 0, 0, 0, 1] and s.rollout_log_probs == [-0.5, -0.25, 0, 0, 0, -1.0]
    assert s.weight_versions == [2, 2, 2, 2, 2, 3] and s.segments() == [(0, 2, True), (2, 5, False), (5, 6, True)]
    with pytest.raises(ValueError, match="sample 7/1: a model segment of 2 tokens"):
        s.append_segment([1, 2], trainable=True, log_probs=[-1.0])
    s.loss_mask.append(1)  # broken by hand
    with pytest.raises(ValueError, match="sample 7/1: response of 6 tokens but 7 loss-mask"):
        s.check()
    env_first = Sample("p", [1]).append_segment([8], trainable=False)
    env_first.append_segment([3], trainable=True, log_probs=[-0.1], weight_versions=[5])
    assert env_first.weight_versions == [5, 5]


def test_chat_turns_find_the_boundary_and_refuse_a_rewriting_template(tiny_qwen2):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    turns = ChatTurns(tok)
    assert turns.suffix == "\n"
    text, ids = turns.observation_ids([{"role": "tool", "content": "42"}], [5, tok.eos_token_id])
    assert text == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] != tok.eos_token_id and tok.decode(ids) == text
    text, ids = turns.observation_ids([{"role": "tool", "content": "42"}], [5])  # turn not closed: eos added
    assert ids[0] == tok.eos_token_id
    # A template that drops earlier assistant turns once a new message comes (like Qwen3's
    # thinking-stripping) is refused at start-up.
    tok.chat_template = ("{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
                         "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}"
                         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    with pytest.raises(ConfigError, match="not prefix-preserving"):
        ChatTurns(tok)


def three_turn_samples(tr, tok, n=4, temperature=0.8, seed=3):
    """``n`` samples of three model turns with two tool observations between them, sampled
    token-in/token-out by an embedded engine holding the trainer's weights."""
    from rlvr.engine.base import SamplingParams
    from rlvr.engine.local.embedded import EmbeddedEngine

    eng = EmbeddedEngine(tr.model, pad_token_id=tok.pad_token_id, seed=seed)
    turns = ChatTurns(tok)
    params = SamplingParams(temperature=temperature, max_new_tokens=6, stop_token_ids=(tok.eos_token_id,))

    async def one(i):
        text, ids = turns.prompt_ids([{"role": "user", "content": f"{i}+{i}="}])
        s = Sample(text, ids, uid=f"{i}/0")
        h = EngineHandle(eng, tok, s.uid)
        for turn in range(3):
            r = await h.generate(s.prompt_ids + s.response_ids, params)
            s.append_segment(r.token_ids, trainable=True, log_probs=r.log_probs, weight_versions=r.weight_versions)
            if turn < 2:
                obs, obs_ids = turns.observation_ids([{"role": "tool", "content": f"result {turn}"}], r.token_ids)
                s.append_segment(obs_ids, trainable=False, text=obs)
        return s

    async def all_():
        return await asyncio.gather(*(one(i) for i in range(n)))

    samples = asyncio.run(all_())
    eng.close()
    for i, s in enumerate(samples):
        s.index, s.reward = i, float(i % 2)
    return samples


@pytest.fixture(scope="module")
def trainer_and_tok(tiny_qwen2):
    from transformers import AutoTokenizer

    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1e-3, clip_grad=0.0), AlgoConfig(),
                 temperature=0.8, n_samples_per_prompt=2)
    return tr, AutoTokenizer.from_pretrained(tiny_qwen2)


def test_trainer_log_probs_of_three_turn_samples_match_the_engine(trainer_and_tok):
    tr, tok = trainer_and_tok
    samples = three_turn_samples(tr, tok)
    assert all(len(s.segments()) == 5 for s in samples)  # model, tool, model, tool, model
    width = max(s.response_length for s in samples)
    with torch.no_grad():
        lp = tr.policy.log_probs(samples, width, False)[0]  # the trainer's own (packed) forward
    diffs = torch.cat([(lp[i, : s.response_length] - torch.tensor(s.rollout_log_probs)).abs()[
        torch.tensor(s.loss_mask, dtype=torch.bool)] for i, s in enumerate(samples)])
    print(f"3-turn log-prob |diff| over {diffs.numel()} model tokens: mean {diffs.mean():.2e} max {diffs.max():.2e}")
    assert diffs.numel() > 0 and diffs.mean() <= 1e-5 and diffs.max() <= 1e-3


def _grad_of(tr, fn):
    tr.model.zero_grad(set_to_none=True)
    fn()
    return torch.cat([p.grad.flatten() for p in tr.model.parameters() if p.grad is not None])


def test_tool_tokens_are_masked_and_add_no_gradient(trainer_and_tok):
    """The SFT/NLL loss of 3-turn samples: its gradient equals one computed by hand from the
    model tokens' log-probs alone (a plain HF forward over prompt + whole response, tool tokens
    kept as context); the tool tokens' placeholder log-probs change nothing."""
    tr, tok = trainer_and_tok
    samples = three_turn_samples(tr, tok, n=3, seed=5)
    assert all(0 in s.loss_mask for s in samples)
    captured = {}
    real_step = tr.optimizer.adamw.step
    tr.optimizer.adamw.step = lambda: captured.setdefault("g", torch.cat(
        [p.grad.flatten().clone() for p in tr.model.parameters()]))
    try:
        state = {k: v.clone() for k, v in tr.model.state_dict().items()}
        tr.train_sft(samples)
        for s in samples:  # garbage where the mask is 0: must not matter
            s.rollout_log_probs = [lp if m else 123.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask)]
        g_trainer = captured.pop("g")
        tr.train_sft(samples)
        g_again = captured.pop("g")
    finally:
        tr.optimizer.adamw.step = real_step
        tr.model.load_state_dict(state)

    def by_hand():
        terms = []
        for s in samples:
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            logits = tr.model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1].float() / tr.policy.temperature
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
            terms.append(lp[torch.tensor(s.loss_mask, dtype=torch.bool)])
        (-torch.cat(terms).mean()).backward()  # per-token mean over the model tokens only

    g_hand = _grad_of(tr, by_hand)
    scale = g_hand.norm()
    assert scale > 0
    assert (g_trainer - g_hand).abs().max() / scale <= 1e-5
    assert torch.equal(g_trainer, g_again)


async def two_turn_generate(args, sample, sampling_params):
    """Turn 1 (3 tokens), a tool observation, turn 2 (300 tokens while the agent's ``long_turn``).
    It never looks at the finish reason: the handle's abort marks the sample aborted anyway."""
    from rlvr.agents import context
    from rlvr.core.types import Status

    ctx = context()
    out = await ctx.engine.generate(sample.prompt_ids, dict(sampling_params, max_new_tokens=3, stop_token_ids=[]))
    sample.append_segment(out.token_ids, trainable=True, log_probs=out.log_probs, weight_versions=out.weight_versions)
    text, ids = ctx.turns.observation_ids([{"role": "tool", "content": "5"}], out.token_ids)
    sample.append_segment(ids, trainable=False, text=text)
    n = 300 if getattr(ctx.agent, "long_turn", True) else 3
    out = await ctx.engine.generate(sample.prompt_ids + sample.response_ids,
                                    dict(sampling_params, max_new_tokens=n, stop_token_ids=[]))
    sample.append_segment(out.token_ids, trainable=True, log_probs=out.log_probs, weight_versions=out.weight_versions)
    sample.status = Status.TRUNCATED if out.finish_reason == "length" else Status.COMPLETED
    return sample


def test_abort_in_the_middle_of_a_multi_turn_sample_regenerates_it(tiny_qwen2):
    """An abort during turn 2 (the rollout's end, or a weight push under --async): the sample
    comes back ABORTED (not graded, never trained), and the next run of its group (the partial
    rollout buffer, the async retry queue) regenerates it from the prompt with an intact mask."""
    from rlvr.runtime.build import load_tokenizer, make_agent
    from rlvr.config import Config, RolloutConfig
    from rlvr.data.dataset import DataSource, PromptRecord
    from rlvr.engine.local.embedded import EmbeddedEngine
    from rlvr.rewards import Grader, RewardConfig
    from rlvr.rollout.rollout import Rollout
    from rlvr.core.types import Status

    tok = load_tokenizer(str(tiny_qwen2))
    engine = EmbeddedEngine(str(tiny_qwen2), pad_token_id=tok.pad_token_id, seed=1, tokenizer=tok)
    cfg = Config()
    cfg.data.apply_chat_template = True
    cfg.agent.custom_generate_function_path = "tests.test_agents:two_turn_generate"
    cfg.rollout = RolloutConfig(rollout_batch_size=1, n_samples_per_prompt=2, rollout_max_response_len=400,
                                partial_rollout=True)
    records = [PromptRecord(prompt="4+4=", label="8", metadata={}, index=0)]
    rollout = Rollout(cfg.rollout, engine, tok, DataSource(records, shuffle=False), Grader(RewardConfig()),
                      apply_chat_template=True, agent=make_agent(cfg, engine, tok))
    group = rollout.next_groups(1)[0]
    params = rollout.sampling_params()

    async def abort_during_turn_2():
        task = asyncio.create_task(rollout.run_group(group, params, True))
        while engine.steps < 20 and not task.done():  # turn 1 is 3 steps: now both samples decode turn 2
            await asyncio.sleep(0.002)
        engine.abort()
        await task

    asyncio.run(abort_during_turn_2())
    assert all(s.status == Status.ABORTED and s.reward is None for s in group)
    assert all([t for _, _, t in s.segments()] == [True, False, True] for s in group)  # cut inside turn 2
    rollout.data_source.add_partial([group])  # what _collect does with --partial-rollout

    rollout.agent.long_turn = False
    (again,) = rollout.data_source.take_partial(1)
    asyncio.run(rollout.run_group(again, params, True))
    for s in again:
        s.check()
        assert s.metadata["agent_regenerated"] == 1 and s.status == Status.TRUNCATED and s.reward is not None
        segs = s.segments()
        assert [t for _, _, t in segs] == [True, False, True] and segs[0][1] == 3 and segs[2][1] - segs[2][0] == 3
        assert s.metadata["turns"] == 2
    engine.close()
