"""Real SmolLM2-135M-Instruct replies to reasoning-gym prompts, kept as the fixture
``tests/data/reasoning_gym_replies.jsonl`` that the answer-extraction tests grade.

How they were made (this script, as committed): the validation split of each task below at its
curriculum level 0 (reasoning-gym 0.1.25), both prompt forms (the bare question, and the question
under a system turn that asks for <answer></answer> tags), the chat template, transformers'
``generate`` with one greedy reply and two sampled at temperature 1 (torch seed 0), at most 64 new
tokens, on CPU in float32; ``truncated``: the reply has no end-of-sequence token.

    OMP_NUM_THREADS=1 python examples/reasoning_gym/make_reply_fixture.py models/smollm2-135m-instruct \\
        tests/data/reasoning_gym_replies.jsonl
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.data.dataset import render_prompt
from rlvr.data.reasoning_gym import held_out_records, parse_spec

TASKS = ("chain_sum", "basic_arithmetic", "products", "count_bits", "gcd", "leg_counting", "letter_counting",
         "spell_backward")


def main(model_dir: str, out: str, per_task: int = 3) -> None:
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = []
    for prompt_form in ("question", "answer_tag"):
        for task in TASKS:
            spec = parse_spec(f"reasoning_gym:{task}?split=val&size={per_task}&prompt={prompt_form}&seed=7")
            spec.tasks[0].level = 0
            records = held_out_records(spec)
            texts = [render_prompt(r.prompt, tok, True) for r in records]
            batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            for mode, kwargs in (("greedy", {"do_sample": False}),
                                 ("sampled", {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                                              "num_return_sequences": 2})):
                with torch.no_grad():
                    ids = model.generate(**batch, max_new_tokens=64, pad_token_id=tok.pad_token_id, **kwargs)
                new = ids[:, batch["input_ids"].shape[1]:]
                replies = tok.batch_decode(new, skip_special_tokens=True)
                per = len(replies) // len(records)
                for i, reply in enumerate(replies):
                    r = records[i // per]
                    truncated = tok.eos_token_id not in new[i].tolist()  # ran to max_new_tokens
                    rows.append({"task": task, "prompt_form": prompt_form, "mode": mode, "reply": reply,
                                 "truncated": truncated,
                                 "answer": r.label, "reasoning_gym": r.metadata["reasoning_gym"],
                                 "question": r.metadata["entry"]["question"]})
            print(task, prompt_form, "done", flush=True)
    with open(out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
