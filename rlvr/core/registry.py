"""Named registries: one per extension point, one dispatch site.

>>> R = Registry("advantage estimator", flag="--advantage-estimator")
>>> @R.register("grpo")
... def grpo(x):
...     return x
>>> R["grpo"](1)
1
>>> R["nope"]
Traceback (most recent call last):
...
KeyError: "unknown advantage estimator 'nope' (--advantage-estimator); valid: grpo"
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")

class Registry(Generic[T]):
    """A name -> object table. Unknown names fail with the valid list; duplicates fail."""

    def __init__(self, kind: str, flag: str | None = None, builtins: tuple[str, ...] = ()):
        self.kind = kind
        self.flag = flag
        self._items: dict[str, T] = {}
        # Modules whose entries register themselves on import, imported on the first read: so
        # the registry's contents never depend on what happened to be imported before, and
        # importing the registry stays cheap (a reward's heavy dependencies load when asked for).
        self._builtins = builtins

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def unregister(self, name: str) -> None:
        """Remove a name (a plugin's test cleaning up after itself); unknown names fail as lookups do."""
        self[name]
        del self._items[name]

    def _load_builtins(self) -> None:
        if self._builtins:
            modules, self._builtins = self._builtins, ()
            for module in modules:
                importlib.import_module(module)

    def __getitem__(self, name: str) -> T:
        self._load_builtins()
        try:
            return self._items[name]
        except KeyError:
            where = f" ({self.flag})" if self.flag else ""
            raise KeyError(
                f"unknown {self.kind} {name!r}{where}; valid: {', '.join(sorted(self._items))}"
            ) from None

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def names(self) -> list[str]:
        self._load_builtins()
        return sorted(self._items)


WORKDIR_ENV = "RLVR_WORKDIR"


def user_workdirs() -> list[str]:
    """Where a user's ``module:fn`` is looked up besides the installed packages: this process's
    working directory and that of the ``rlvr`` command that started it (``RLVR_WORKDIR``, which
    the command sets and the processes it starts inherit: engine processes, Ray actors, whose own
    working directory may differ)."""
    dirs = [os.getcwd(), os.environ.get(WORKDIR_ENV, "")]
    return list(dict.fromkeys(os.path.abspath(d) for d in dirs if d))


def import_user_module(module_name: str):
    """``importlib.import_module`` that also finds a module in the user's working directory, as
    ``python -m`` does (the ``rlvr`` console script puts its own directory first instead). The
    directories are appended, so an installed package of the same name wins."""
    on_path = {os.path.abspath(p) for p in sys.path if p}
    sys.path.extend(d for d in user_workdirs() if d not in on_path)
    return importlib.import_module(module_name)


def split_path(path: str, flag: str, example: str = "pkg.module:function") -> tuple[str, str]:
    """(module, attribute) of ``"pkg.module:attr"`` or ``"pkg.module.attr"``; a ConfigError naming
    ``flag`` when it is neither (a bare module name, an empty side)."""
    from rlvr.core.errors import ConfigError

    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(flag, f"{path!r} is not 'pkg.module:name': give the module and the name in it, "
                                f"e.g. {example}")
    return module_name, attr


def load_object(path: str, flag: str, example: str = "pkg.module:function"):
    """The object ``"pkg.module:name"`` names (module from the installed packages or the working
    directory); a ConfigError naming ``flag`` saying what could not be found."""
    from rlvr.core.errors import ConfigError

    module_name, attr = split_path(path, flag, example)
    try:
        module = import_user_module(module_name)
    except ImportError as e:
        where = f" (looked in the installed packages and in {', '.join(user_workdirs())})" if e.name == module_name else ""
        raise ConfigError(flag, f"cannot import module {module_name!r} from {path!r}: {e}{where}") from e
    if not hasattr(module, attr):
        raise ConfigError(flag, f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no {attr!r}")
    return getattr(module, attr)


def load_function(path: str, flag: str) -> Callable:
    """Import a user function given as ``"pkg.module:fn"`` or ``"pkg.module.fn"``.

    Failures raise ``ConfigError(flag, ...)`` saying what could not be found.
    """
    from rlvr.core.errors import ConfigError

    fn = load_object(path, flag)
    if not callable(fn):
        raise ConfigError(flag, f"{path!r} is a {type(fn).__name__}, not a function")
    return fn


def resolve(registry: Registry[T], name_or_path: str, flag: str,
            alias: Callable[[str], str | None] | None = None) -> T:
    """A registered name, or else a dotted path to a user function. ``alias`` maps another
    system's path to the registered name it stands for (None: not one of its paths); the
    builders pass slime's (``rlvr.compat.slime.paths.slime_equivalent``)."""
    name_or_path = (alias(name_or_path) if alias is not None else None) or name_or_path
    if name_or_path in registry:
        return registry[name_or_path]
    if "." not in name_or_path and ":" not in name_or_path:
        registry[name_or_path]  # raises with the list of valid names
    return load_function(name_or_path, flag)
