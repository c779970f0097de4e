"""Build a tiny, real Hugging Face causal LM checkpoint directory.

The result is an ordinary checkpoint (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json`` with a chat template, ``generation_config.json``)
that ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` load exactly
as they load a downloaded Qwen or Llama. Nothing is fetched from a hub.

The tokenizer is byte-level BPE with no merges: every byte is one token (GPT-2's
byte-to-unicode alphabet, so it round-trips spaces and newlines after reload — a plain
character vocabulary does not under transformers 5), plus the Qwen-style
special tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``. Digits are single tokens,
which is what a tiny arithmetic learner wants.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen-style ChatML template; `add_generation_prompt` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Architectures the builder knows; any HF causal LM works at run time, these are just the
# ones a test can create without a download (tests/test_model_matrix.py runs each of them).
# ``config`` holds what the family needs beyond the common sizes; ``per_head``: config fields set
# to the head size (families whose default head_dim or query_pre_attn_scalar is a fixed 128/256).
# The features that make a family differ are on and made to bite at tiny scale: a sliding window
# of 8 tokens (RL prompts + responses are longer), alternating with full-attention layers where
# the family mixes them, and soft-capping at 0.5 (Gemma 2's defaults, 50 and 30, would leave a
# random tiny model's numbers untouched; 0.5 moves its logits at the default initialisation and
# its attention scores once the weights are larger, as tests/test_model_matrix.py makes them).
TINY_WINDOW = 8
ARCHITECTURES = {
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"]),
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"]),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], per_head=["head_dim"]),
    "qwen3_moe": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], per_head=["head_dim"],
                      config=dict(num_experts=4, num_experts_per_tok=2), moe=True),
    "mistral": dict(model_type="mistral", architectures=["MistralForCausalLM"],
                    config=dict(sliding_window=TINY_WINDOW)),
    "gemma2": dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"],
                   per_head=["head_dim", "query_pre_attn_scalar"],
                   config=dict(sliding_window=TINY_WINDOW, attn_logit_softcapping=0.5, final_logit_softcapping=0.5),
                   alternate_layers=True),
    "gemma3": dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"],
                   per_head=["head_dim", "query_pre_attn_scalar"], config=dict(sliding_window=TINY_WINDOW),
                   alternate_layers=True),
    "phi3": dict(model_type="phi3", architectures=["Phi3ForCausalLM"]),
    "gpt_neox": dict(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"]),
    "cohere": dict(model_type="cohere", architectures=["CohereForCausalLM"]),  # logits * logit_scale (0.0625)
}


def _byte_alphabet() -> list[str]:
    return pre_tokenizers.ByteLevel.alphabet()


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: 256 byte tokens + 3 special tokens, with a chat template."""
    alphabet = sorted(_byte_alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _arch_fields(spec: dict, head_dim: int, intermediate_size: int, num_layers: int) -> dict:
    """The config fields an architecture of ``ARCHITECTURES`` adds to the common ones."""
    extra = dict(spec.get("config", {}))
    extra.update({name: head_dim for name in spec.get("per_head", [])})
    if spec.get("moe"):
        extra["moe_intermediate_size"] = intermediate_size // 2
    if spec.get("alternate_layers"):  # sliding, full, sliding, ... (Gemma 2's pattern; Gemma 3 has 5:1)
        extra["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    return extra


def build_tiny_model(
    out_dir: str | Path,
    arch: str = "qwen2",
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 512,
    seed: int = 0,
    **config_overrides,
) -> Path:
    """Write a randomly initialised tiny causal LM and its tokenizer to ``out_dir``.
    ``config_overrides`` are config fields set last (e.g. ``use_sliding_window=True`` for Qwen2)."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {arch!r}; valid: {', '.join(ARCHITECTURES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    spec = ARCHITECTURES[arch]
    extra = _arch_fields(spec, hidden_size // num_heads, intermediate_size, num_layers) | config_overrides
    config = AutoConfig.for_model(
        spec["model_type"],
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        architectures=spec["architectures"],
        **extra,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "rlvr_tiny.json").write_text(json.dumps({"arch": arch, "seed": seed}) + "\n")
    return out
