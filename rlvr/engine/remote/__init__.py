"""Engines reached over a transport: clients of SGLang-protocol and vLLM servers, the engine supervisor
with its `rlvr serve` processes, the one failure policy, the pick of an engine, and weight transfer to servers."""
