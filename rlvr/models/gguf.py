"""GGUF file -> plain Hugging Face checkpoint directory (``rlvr import-gguf``).

transformers reads GGUF itself (``from_pretrained(dir, gguf_file=NAME)``, with the ``gguf``
package), dequantizing every tensor, but a model loaded that way keeps a ``quantization_config``
and ``save_pretrained`` refuses it. This module loads the file that way, rebuilds the model from
its config without the quantization entry, loads the dequantized weights and writes an ordinary
checkpoint: ``config.json``, ``model.safetensors``, the tokenizer with its chat template and
``generation_config.json`` (eos/pad/bos from the tokenizer when the file names none). Nothing is
downloaded.

An architecture transformers has no GGUF loader for is refused from the file's metadata before
loading; a quantization it (or gguf under it) cannot dequantize surfaces while loading, as a
``ValueError`` or ``NotImplementedError`` depending on the version. Both become a ``DataError``
naming the file, what is in it and what to do.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rlvr.core.errors import DataError

log = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16")
INSTALL_HINT = "pip install 'rlvr[gguf]' (or: pip install gguf accelerate)"


def _gguf():
    """The gguf package, after checking that accelerate is there too (transformers' GGUF loading needs it)."""
    for package in ("gguf", "accelerate"):
        try:
            __import__(package)
        except ImportError:
            raise DataError(package, None, f"reading a GGUF file needs the {package} package: {INSTALL_HINT}") from None
    import gguf

    return gguf


def supported_architectures() -> set[str]:
    """The ``general.architecture`` values this transformers' GGUF loaders read (its legacy
    loader's list, and since 5.2x the list of its packed-weight loader too)."""
    names: set[str] = set()
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        names |= set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}  # metadata groups, not models
    except ImportError:
        pass
    try:
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS

        names |= set(GGUF_ARCHS)
    except ImportError:
        pass
    return names


def read_header(path: str | Path) -> tuple[str | None, dict[str, int]]:
    """(``general.architecture``, {tensor type name: count}) of a GGUF file, read with gguf."""
    gguf = _gguf()
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), None, "no such GGUF file")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as e:
        raise DataError(str(path), None, f"not a readable GGUF file ({e})") from None
    field = reader.fields.get("general.architecture")
    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return (field.contents() if field is not None else None), types


def check_architecture(path: Path, arch: str | None) -> None:
    """``DataError`` naming the file when transformers has no GGUF loader for ``arch``."""
    known = supported_architectures()
    # transformers renames a few llama.cpp names before its own check (qwen2moe -> qwen2_moe, ...).
    if not known or arch in known or (arch and arch.replace("moe", "_moe") in known):
        return
    raise DataError(str(path), None, f"architecture {arch!r} cannot be read by transformers' GGUF loader "
                    f"(transformers {_version('transformers')} reads: {', '.join(sorted(known))}); convert the "
                    "model's original Hugging Face checkpoint instead, or use a GGUF of one of those architectures")


def _load_error(path: Path, types: dict[str, int], error: Exception) -> DataError:
    """What to do when transformers (or gguf under it) cannot dequantize the file's tensors."""
    listed = ", ".join(f"{name} x{n}" for name, n in sorted(types.items()))
    return DataError(str(path), None, f"transformers {_version('transformers')} / gguf {_version('gguf')} could "
                     f"not load it ({type(error).__name__}: {error}); its tensor types: {listed}. When a type "
                     "is what they cannot dequantize, use a file quantized to one they do (F32, F16, BF16, Q8_0, "
                     "Q4_0, Q4_1, Q4_K, Q6_K, ...; llama.cpp's llama-quantize converts), or a newer gguf/transformers")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "(version unknown)"


def import_gguf(path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write ``path`` (a GGUF file) as a plain HF checkpoint in ``out_dir``; returns ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if dtype not in DTYPES:
        raise DataError("--dtype", None, f"{dtype!r} is not one of {', '.join(DTYPES)}")
    path = Path(path)
    arch, types = read_header(path)
    check_architecture(path, arch)
    log.info("reading %s (%s) with transformers' GGUF loader", path, arch)
    kwargs = dict(gguf_file=path.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs)
    except (ValueError, NotImplementedError) as e:
        raise _load_error(path, types, e) from e
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # what makes save_pretrained refuse; the weights are dequantized
    config.dtype = getattr(torch, dtype)
    model = type(loaded)(config).to(getattr(torch, dtype))
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k not in _tied_keys(model)]:
        raise DataError(str(path), None, f"weights do not match {type(model).__name__}: "
                        f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = _generation_config(GenerationConfig, loaded.generation_config, tokenizer)
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    log.info("wrote %s: %s, %.1fM parameters, %s", out, type(model).__name__,
             sum(p.numel() for p in model.parameters()) / 1e6, dtype)
    return out


def _tied_keys(model) -> set[str]:
    """Parameter names that tying fills (the output head of a tied-embedding model)."""
    return {"lm_head.weight"} if model.config.tie_word_embeddings else set()


def _generation_config(cls, loaded, tokenizer):
    """The loaded generation config, with eos/pad/bos from the tokenizer where it names none."""
    gen = cls.from_dict(loaded.to_dict())
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(gen, name, None) is None and getattr(tokenizer, name, None) is not None:
            setattr(gen, name, getattr(tokenizer, name))
    return gen
