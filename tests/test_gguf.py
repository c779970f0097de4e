"""``rlvr import-gguf``: GGUF files written here with the gguf package's own writer.

A tiny Llama (``rlvr.models.tiny``) is written as a GGUF file the way llama.cpp's converter
lays it out (tensor names, Q/K rows permuted for its RoPE, byte-level tokenizer metadata, chat
template), converted back with ``rlvr import-gguf``, and must give the original's logits and
tokens. Two more files are refused with the file named: an architecture transformers has no GGUF
loader for, and a tensor quantized as Q8_1, which gguf cannot dequantize.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.entrypoints.cli import main
from rlvr.models.tiny import CHAT_TEMPLATE, build_tiny_model
from tests.conftest import SMALL

gguf = pytest.importorskip("gguf", reason="rlvr import-gguf needs the gguf package: pip install 'rlvr[gguf]'")


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row order (convert_hf_to_gguf.py ``LlamaModel.permute``); transformers undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(model) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 array, for a Llama with tied embeddings (no ``output.weight``)."""
    c, sd = model.config, {k: v.float().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    names = {"input_layernorm": "attn_norm", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for i in range(c.num_hidden_layers):
        for hf, g in names.items():
            out[f"blk.{i}.{g}.weight"] = sd[f"model.layers.{i}.{hf}.weight"]
        out[f"blk.{i}.attn_q.weight"] = _permute(sd[f"model.layers.{i}.self_attn.q_proj.weight"], c.num_attention_heads)
        out[f"blk.{i}.attn_k.weight"] = _permute(sd[f"model.layers.{i}.self_attn.k_proj.weight"], c.num_key_value_heads)
    return out


def write_llama_gguf(hf_dir, path, arch: str = "llama", raw: dict | None = None):
    """``hf_dir`` (a tiny Llama) as a GGUF file at ``path``; ``raw``: tensors written in place of
    the model's as they are, name -> (uint8 blocks [rows, bytes per row], GGMLQuantizationType)."""
    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    tok, c = AutoTokenizer.from_pretrained(hf_dir), model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    special = {t.content for t in tok.added_tokens_decoder.values() if t.special}
    w.add_tokenizer_model("gpt2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in special else 1 for t, _ in vocab])  # 3: control, 1: normal
    w.add_token_scores([0.0] * len(vocab))  # no merges (byte tokens only, as in rlvr.models.tiny)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(CHAT_TEMPLATE)
    raw = raw or {}
    for name, array in _tensors(model).items():
        if name in raw:
            w.add_tensor(name, raw[name][0], raw_shape=raw[name][0].shape, raw_dtype=raw[name][1])
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny_llama"), arch="llama", **SMALL, initializer_range=0.2)


def test_a_gguf_file_converts_to_the_same_model(tiny_llama, tmp_path, capsys):
    path = write_llama_gguf(tiny_llama, tmp_path / "tiny.gguf")
    out = tmp_path / "hf"
    assert main(["import-gguf", str(path), str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"]
    converted, original = AutoModelForCausalLM.from_pretrained(out), AutoModelForCausalLM.from_pretrained(tiny_llama)
    assert converted.lm_head.weight.data_ptr() == converted.model.embed_tokens.weight.data_ptr()
    tok, ref_tok = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(tiny_llama)
    chat = [{"role": "user", "content": "12 + 34 =\n a b"}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == ref_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == ref_tok(text, add_special_tokens=False)["input_ids"] and tok.decode(ids) == text
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == tok.eos_token_id
    with torch.no_grad():
        diff = (converted(torch.tensor([ids])).logits - original(torch.tensor([ids])).logits).abs().max()
    assert diff <= 1e-5, diff  # F32 tensors: the same numbers, Q/K permutation undone


def test_bfloat16_output(tiny_llama, tmp_path):
    path = write_llama_gguf(tiny_llama, tmp_path / "tiny.gguf")
    assert main(["import-gguf", str(path), str(tmp_path / "hf"), "--dtype", "bfloat16"]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype="auto")
    assert model.dtype == torch.bfloat16


def test_an_architecture_transformers_cannot_read_is_refused(tiny_llama, tmp_path, capsys):
    path = write_llama_gguf(tiny_llama, tmp_path / "odd.gguf", arch="rwkv7")
    assert main(["import-gguf", str(path), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: architecture 'rwkv7' cannot be read by transformers' GGUF loader" in err
    assert "llama" in err and "convert the model's original Hugging Face checkpoint" in err
    assert not (tmp_path / "hf").exists()


def test_a_quantization_gguf_cannot_dequantize_is_refused(tiny_llama, tmp_path, capsys):
    # One real weight as Q8_1 (32 values per 40-byte block): gguf 0.19 writes it but cannot dequantize it.
    q81 = gguf.GGMLQuantizationType.Q8_1
    block, size = gguf.GGML_QUANT_SIZES[q81]
    rows, cols = SMALL["hidden_size"], SMALL["intermediate_size"]  # ffn_down: [hidden, intermediate]
    raw = {"blk.0.ffn_down.weight": (np.zeros((rows, cols // block * size), dtype=np.uint8), q81)}
    path = write_llama_gguf(tiny_llama, tmp_path / "q81.gguf", raw=raw)
    assert main(["import-gguf", str(path), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: transformers" in err and "could not load it" in err
    assert "Dequantization for Q8_1" in err and "Q8_1 x1" in err and "F32 x" in err and "llama-quantize" in err


def test_a_missing_file_is_named(tmp_path, capsys):
    assert main(["import-gguf", str(tmp_path / "none.gguf"), str(tmp_path / "hf")]) == 2
    assert f"{tmp_path / 'none.gguf'}: no such GGUF file" in capsys.readouterr().err
