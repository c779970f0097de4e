"""``rlvr agents check [module:fn] FLAGS``: one prompt through a user's multi-turn rollout, shown.

Before a long run, see what will be trained: the first prompt of ``--prompt-data`` goes through
the generate function (``module:fn`` stands for ``--custom-generate-function-path``; or the
``--tools`` / ``--environment-path`` loop of the flags) on the configured model, exactly as a
rollout runs it (same engine, chat template, budget, checks, reward; the flags are checked as ``rlvr train``
checks them), and each sample is printed
as its segments: model tokens (loss mask 1, trained) and observation / tool tokens (loss mask 0),
with token counts, then its status, reward, turns and tool calls. A sample whose function failed
prints its traceback; the command then exits with status 1.

    rlvr agents check my_agent:generate --hf-checkpoint Qwen/Qwen2.5-0.5B-Instruct \\
        --prompt-data train.jsonl --apply-chat-template --rollout-max-response-len 512
"""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from rlvr.core.errors import ConfigError

if TYPE_CHECKING:
    from rlvr.core.types import Sample

_WIDTH = 100


def _parse(argv: list[str]):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0)
    function = argv[0] if not argv[0].startswith("-") else None  # module:fn, first or not at all
    p = argparse.ArgumentParser(prog="rlvr agents check", add_help=False)
    p.add_argument("--check-samples", type=int, default=1, help="samples of the first prompt to run (default 1)")
    own, rest = p.parse_known_args(argv[1:] if function else argv)
    own.function = function
    from rlvr.config.parse import make_parser

    ns = make_parser("rlvr agents check").parse_args(rest)  # declarative: --help imports no implementation
    from rlvr.runtime.configure import config_from_values, merged_values

    values = merged_values(ns)
    if own.function is not None:
        values["custom_generate_function_path"] = own.function
    cfg = config_from_values(values)  # the checks of `rlvr train` with the same flags
    if not 1 <= own.check_samples <= cfg.rollout.n_samples_per_prompt:
        raise ConfigError("--check-samples", f"must be between 1 and --n-samples-per-prompt "
                                             f"{cfg.rollout.n_samples_per_prompt}")
    if not cfg.agent.per_sample:
        raise ConfigError("rlvr agents check", "give the generate function (module:fn), --tools or --environment-path"
                                               " (a --rollout-function-path runs whole rollouts: try it with "
                                               "--debug-rollout-only --num-rollout 1 --save-debug-rollout-data)")
    return cfg, own.check_samples


def show(s: Sample, decode) -> list[str]:
    """The lines that describe one sample: its prompt, segments with masks, and outcome."""
    lines = [f"=== sample {s.uid or s.index}: status {s.status.value}, reward {s.reward}, "
             f"{s.response_length} response tokens ===",
             f"[prompt       {len(s.prompt_ids):4d} tok] {s.prompt!r}"]
    for a, b, trainable in s.segments():
        kind = "model  mask=1" if trainable else "obs    mask=0"
        lines.append(f"[{kind} {b - a:4d} tok] {decode(s.response_ids[a:b])!r}")
    masked = s.response_length - sum(s.loss_mask)
    m = s.metadata
    lines.append(f"turns {m.get('turns', 0)}, tool calls {m.get('tool_calls', 0)} ({m.get('tool_errors', 0)} errors), "
                 f"masked tokens {masked} of {s.response_length}"
                 + (f", cut to the budget: {m['cut_tokens']} tokens" if "cut_tokens" in m else ""))
    if "agent_error" in m:
        lines.append(f"FAILED: {m['agent_error']}\n{m['agent_traceback']}")
    if "reward_error" in m:
        lines.append(f"reward failed: {m['reward_error']}")
    return lines


def main(argv: list[str]) -> int:
    cfg, k = _parse(argv)
    from rlvr.runtime.build import build_engine, load_tokenizer, make_rollout, open_training_data

    tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
    engine = build_engine(cfg, cfg.train.hf_checkpoint, tokenizer)
    try:
        rollout = make_rollout(cfg, engine, tokenizer, open_training_data(cfg, tokenizer))
        group = rollout.next_groups(1)[0][:k]
        asyncio.run(rollout.run_group(group, rollout.sampling_params(), False))
    finally:
        getattr(engine, "close", lambda: None)()
    print(f"rlvr agents check: {cfg.agent.custom_generate_function_path or cfg.agent.tools or cfg.agent.environment_path}"
          f" on {cfg.train.hf_checkpoint}, budget {cfg.rollout.rollout_max_response_len} response tokens")
    for s in group:
        print("\n".join(show(s, tokenizer.decode)))
    failed = sum("agent_error" in s.metadata for s in group)
    print(f"{len(group) - failed} of {len(group)} samples ok" + (f"; {failed} failed (tracebacks above)" if failed else ""))
    return 1 if failed else 0
