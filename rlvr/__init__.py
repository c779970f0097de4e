"""rlvr: reinforcement-learning post-training for LLMs with verifiable rewards.

The layers (see docs/design.md): ``config``/``cli`` -> ``loop`` -> ``rollout`` / ``train``
-> ``engine`` / ``rewards`` / ``algo`` / ``data`` / ``observe``. What users' plugins import
lives in ``rlvr.api``.
"""

__version__ = "0.1.0"

# Old module paths (rlvr.types, ...) keep importing, with a warning naming the new one.
from rlvr.core import moved as _moved  # noqa: E402

_moved.install()
