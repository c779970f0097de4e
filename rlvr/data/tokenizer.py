"""The checkpoint's tokenizer, as every part of rlvr loads it (trainer side, engines, servers)."""

from __future__ import annotations

from transformers import AutoTokenizer


def load_tokenizer(path: str):
    """The checkpoint's tokenizer; one without a pad token pads with EOS."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
