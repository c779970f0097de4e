"""``rlvr serve``: a checkpoint behind SGLang's HTTP routes and OpenAI-compatible ones
(``rlvr.engine.serving.routes`` holds the routes), on 127.0.0.1 unless ``--host`` says otherwise.

The flags are parsed before anything heavy is imported (``rlvr serve --help`` loads no torch);
the engine is built by the same builder as local mode's and Ray's engines
(``rlvr.runtime.build.embedded_engine``), from a ``Config`` holding these flags' values.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlvr.core.errors import ConfigError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlvr serve", description="serve a HF checkpoint over SGLang's HTTP protocol")
    p.add_argument("--hf-checkpoint", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 exposes it to the network")
    p.add_argument("--port", type=int, default=30000, help="port to listen on")
    p.add_argument("--max-running-requests", type=int, default=256, help="rows decoded together (batch slots)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling stream")
    p.add_argument("--served-model-name", default=None, help="model name in OpenAI responses; default the path")
    p.add_argument("--enable-return-routed-experts", action="store_true",
                   help="MoE: record each position's routed experts; a /generate with return_routed_experts gets them (R3)")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    p.add_argument("--deterministic-mode", action="store_true",
                   help="batch-invariant decoding (one forward per prompt group) and torch's deterministic algorithms")
    p.add_argument("--mem-fraction-static", type=float, default=None,
                   help="fraction of the device's memory for weights + KV cache (SGLang's flag; default: no budget)")
    return p


def check(a: argparse.Namespace) -> None:
    if not (Path(a.hf_checkpoint) / "config.json").is_file():
        raise ConfigError("--hf-checkpoint", f"{a.hf_checkpoint} has no config.json; point it at a HF model directory")
    if a.max_running_requests < 1:
        raise ConfigError("--max-running-requests", f"must be >= 1, got {a.max_running_requests}")
    if a.mem_fraction_static is not None and not 0 < a.mem_fraction_static <= 1:
        raise ConfigError("--mem-fraction-static", f"must be in (0, 1], got {a.mem_fraction_static}")


def engine_config(a: argparse.Namespace):
    """The ``Config`` whose fields the engine builder reads, from the serve flags (the training
    fields keep their defaults: nothing here trains)."""
    from rlvr.config import build_config

    return build_config({"hf_checkpoint": a.hf_checkpoint, "seed": a.seed, "device": a.device,
                         "rollout_max_running_requests": a.max_running_requests,
                         "sglang_mem_fraction_static": a.mem_fraction_static,
                         "use_rollout_routing_replay": a.enable_return_routed_experts,
                         "deterministic_mode": a.deterministic_mode})


def main(argv: list[str]) -> None:
    a = parser().parse_args(argv)
    check(a)
    from aiohttp import web

    from rlvr.core.device import resolve
    from rlvr.data.tokenizer import load_tokenizer
    from rlvr.engine.serving.routes import Server
    from rlvr.runtime.build import embedded_engine

    cfg = engine_config(a)
    tokenizer = load_tokenizer(a.hf_checkpoint)
    engine = embedded_engine(cfg, a.hf_checkpoint, tokenizer, device=resolve(a.device))
    server = Server(engine, tokenizer, a.served_model_name or a.hf_checkpoint)
    print(f"rlvr serve: {a.hf_checkpoint} on http://{a.host}:{a.port}", flush=True)
    web.run_app(server.app(), host=a.host, port=a.port, print=None)
