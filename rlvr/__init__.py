"""rlvr: reinforcement-learning post-training for LLMs with verifiable rewards.

The layers (see docs/design.md): ``config``/``cli`` -> ``loop`` -> ``rollout`` / ``train``
-> ``engine`` / ``rewards`` / ``algo`` / ``data`` / ``observe``.
"""

__version__ = "0.1.0"
