"""Bridges for module paths that moved: an old path still imports, with a ``DeprecationWarning``
(``MovedWarning``) that names where to import from now.

``MOVED`` maps each old path to ``(the module that holds its names now, what to import instead)``.
``rlvr/__init__.py`` appends ``FINDER`` to ``sys.meta_path``; Python asks it only after every other
finder failed, and it answers only the names in ``MOVED``, so it costs nothing to code that uses
the current paths. An old path resolves to the new module object itself (``rlvr.types.Status is
rlvr.core.types.Status``), so isinstance checks and enum comparisons hold across both paths.

Python hides a ``DeprecationWarning`` raised outside ``__main__`` by default; the ``rlvr``
command shows ``MovedWarning``s (``show_moved_warnings``) unless ``-W`` / ``PYTHONWARNINGS`` say
otherwise, because users' plugins are imported by rlvr, never as ``__main__``.

>>> import sys, warnings
>>> _ = sys.modules.pop("rlvr.types", None)  # as in a fresh process
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     from rlvr.types import Status
>>> Status.COMPLETED.value, caught[0].category.__name__
('completed', 'MovedWarning')
>>> print(caught[0].message)
rlvr.types is deprecated: import Sample, Status from rlvr.api (the module is rlvr.core.types now)
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings

_API = "rlvr.api"

# old path -> (module holding its names now, what a user imports instead); docs/changelog.md lists the moves
MOVED: dict[str, tuple[str, str]] = {
    "rlvr.types": ("rlvr.core.types", f"import Sample, Status from {_API}"),
    "rlvr.errors": ("rlvr.core.errors", f"import ConfigError, DataError from {_API}"),
    "rlvr.registry": ("rlvr.core.registry", "import from rlvr.core.registry"),
    "rlvr.jsonl": ("rlvr.core.jsonl", "import from rlvr.core.jsonl"),
    "rlvr.device": ("rlvr.core.device", "import from rlvr.core.device"),
    "rlvr.testing": ("rlvr.core.testing", "import from rlvr.core.testing"),
    "rlvr.fields": ("rlvr.config.fields", "import from rlvr.config.fields"),
    "rlvr.slime_flags": ("rlvr.compat.slime.flags", "import from rlvr.compat.slime.flags"),
    "rlvr.slime_plugins": ("rlvr.compat.slime.plugins", "import from rlvr.compat.slime.plugins"),
    "rlvr.loop": ("rlvr.runtime.loop", "import from rlvr.runtime.loop"),
    "rlvr.build": ("rlvr.runtime.build", "import from rlvr.runtime.build"),
    "rlvr.colocate": ("rlvr.runtime.colocate", "import from rlvr.runtime.colocate"),
    "rlvr.checkpoint": ("rlvr.runtime.checkpoint", "import from rlvr.runtime.checkpoint"),
    "rlvr.cli": ("rlvr.entrypoints.cli", "run `python -m rlvr`, or import from rlvr.entrypoints.cli"),
    "rlvr.sft": ("rlvr.entrypoints.sft", "import from rlvr.entrypoints.sft"),
    "rlvr.evaluate": ("rlvr.entrypoints.evaluate", "import from rlvr.entrypoints.evaluate"),
    "rlvr.demo": ("rlvr.entrypoints.demo", "import from rlvr.entrypoints.demo"),
    "rlvr.agents.engine": ("rlvr.agents.session", f"import EngineHandle from {_API}"),
    "rlvr.agents.config": ("rlvr.config.agent", "import AgentConfig from rlvr.config"),
    "rlvr.algo.config": ("rlvr.config.algo", f"import AlgoConfig from {_API}"),
    "rlvr.engine.config": ("rlvr.config.engine", "import EngineConfig from rlvr.config"),
    "rlvr.rewards.config": ("rlvr.config.reward", "import RewardConfig from rlvr.config"),
    "rlvr.distributed.config": ("rlvr.config.cluster", "import ClusterConfig from rlvr.config"),
    "rlvr.distributed.engine_faults": ("rlvr.distributed.engines", "import from rlvr.distributed.engines"),
    "rlvr.data.slime_source": ("rlvr.runtime.slime_source", "import from rlvr.runtime.slime_source"),
    "rlvr.rewards.sandbox": ("rlvr.sandbox.runner", "import from rlvr.sandbox.runner"),
    "rlvr.rewards.sandbox_launcher": ("rlvr.sandbox.launcher", "import from rlvr.sandbox.launcher"),
    **{f"rlvr.rewards.math_{m}": (f"rlvr.rewards.math.{m}", f"import from rlvr.rewards.math.{m}")
       for m in ("equiv", "extract", "forms", "units", "words")},
    **{f"rlvr.engine.{old}": (f"rlvr.engine.{new}", f"import from rlvr.engine.{new}")
       for old, new in (("embedded", "local.embedded"), ("kv", "local.kv"), ("scoring", "local.scoring"),
                        ("vllm_engine", "local.vllm"), ("client", "remote.client"),
                        ("sglang_http", "remote.sglang_http"), ("vllm_http", "remote.vllm_http"),
                        ("vllm_nccl", "remote.vllm_nccl"), ("supervisor", "remote.supervisor"),
                        ("processes", "remote.processes"), ("failures", "remote.failures"),
                        ("balance", "remote.balance"), ("server", "serving.routes"))},
}


class MovedWarning(DeprecationWarning):
    """An import used a path that moved; the message names the one to use."""


def moved_message(old: str) -> str:
    new, advice = MOVED[old]
    return f"{old} is deprecated: {advice} (the module is {new} now)"


def _internal(frame) -> bool:
    """A frame of the import system, which ``warnings.warn`` skips when it counts ``stacklevel``."""
    return "importlib" in frame.f_code.co_filename and "_bootstrap" in frame.f_code.co_filename


def _importer_stacklevel() -> int:
    """warnings.warn's stacklevel of the first frame outside the import machinery and this file:
    the line of user code that imported the old path."""
    here = __file__
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename == here or "importlib" in frame.f_code.co_filename):
        frame = frame.f_back
        if frame is not None and not _internal(frame):
            level += 1
    return level


class _Bridge:  # importlib.abc.Loader's two methods (importlib.abc itself costs ~10 ms to import)
    def create_module(self, spec):
        return None  # a plain module, replaced by the new one in exec_module

    def exec_module(self, module) -> None:
        old = module.__name__
        warnings.warn(moved_message(old), MovedWarning, stacklevel=_importer_stacklevel())
        # the import system returns what sys.modules holds for the name once this returns
        sys.modules[old] = importlib.import_module(MOVED[old][0])


class _MovedFinder:  # an importlib.abc.MetaPathFinder
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.machinery.ModuleSpec(fullname, _Bridge())
        return None


FINDER = _MovedFinder()


def install() -> None:
    """Make the old paths importable (``rlvr/__init__.py`` calls it; idempotent)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(FINDER)


def show_moved_warnings() -> None:
    """Print each ``MovedWarning`` once per place (the ``rlvr`` command calls it), unless the
    user chose warning filters with ``-W`` or ``PYTHONWARNINGS``."""
    if not sys.warnoptions:
        warnings.filterwarnings("default", category=MovedWarning)
