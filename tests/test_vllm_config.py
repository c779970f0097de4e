"""``--rollout-engine vllm``: what the config refuses before any engine starts, and the build choices
that follow the flag. Needs no vLLM (it runs in every environment)."""

import pytest

from rlvr.core.errors import ConfigError
from rlvr.runtime.build import lora_engines_merge, vllm_lora
from rlvr.runtime.configure import parse_config


@pytest.fixture()
def base(tiny_qwen2, arith_files):
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]), "--rollout-engine", "vllm"]


@pytest.mark.parametrize("extra, flag", [
    (["--deterministic-mode"], "--deterministic-mode"),
    (["--rollout-top-p", "0.9"], "--rollout-top-p"),
    (["--rollout-top-k", "20"], "--rollout-top-k"),
    (["--colocate"], "--colocate"),
    (["--rollout-num-engines", "2"], "--rollout-engine"),
    (["--use-fault-tolerance"], "--rollout-engine"),
    (["--lora-rank", "600"], "--lora-rank"),
])
def test_what_vllm_cannot_honour_is_refused_with_the_reason(base, extra, flag):
    with pytest.raises(ConfigError, match=flag) as e:
        parse_config(base + extra)
    assert "vllm" in str(e.value).lower()


def test_vllm_engine_takes_lora_adapters(base):
    cfg = parse_config(base + ["--lora-rank", "4"])
    assert cfg.engine.rollout_engine == "vllm" and not lora_engines_merge(cfg)  # vLLM's LoRA route
    assert vllm_lora(cfg) == {"lora_rank": 4, "lora_alpha": 8.0}
    assert vllm_lora(parse_config(base)) == {"lora_rank": 0, "lora_alpha": None}
    assert not lora_engines_merge(parse_config(base[:-2] + ["--lora-rank", "4"]))  # the embedded engine holds the adapter
    servers = ["--rollout-external-engine-addrs", "127.0.0.1:1"]
    assert lora_engines_merge(parse_config(base[:-2] + servers + ["--lora-rank", "4"]))  # SGLang-protocol servers
    assert not lora_engines_merge(parse_config(base + servers + ["--lora-rank", "4"]))  # vLLM servers: adapters


def test_unknown_engine_lists_the_choices(base, capsys):
    with pytest.raises(SystemExit):
        parse_config(base[:-1] + ["sglang"])
    assert "--rollout-engine: invalid choice: 'sglang' (choose from 'embedded', 'vllm')" in capsys.readouterr().err
