"""The typed config: one source of truth for flags, YAML files and validation.

- ``fields``: how a field is declared (default, one-line help, bounds, choices).
- ``groups`` and ``agent``, ``algo``, ``cluster``, ``engine``, ``reward``: the groups, each a
  dataclass whose field names are slime's flag names with underscores.
- ``root``: ``Config`` (one field per group) and the rules between groups.
- ``parse``: argparse and YAML to a ``Config``.

This package is declarative: it imports nothing of rlvr but ``rlvr.core`` and
``rlvr.compat`` (slime's flag names). What needs the implementations -- names checked against
the registries, data files, user tools, the model's experts -- is checked by
``rlvr.runtime.configure``, whose ``parse_config`` is what the ``rlvr`` command runs.
"""

from rlvr.config.agent import AgentConfig
from rlvr.config.algo import AlgoConfig
from rlvr.config.cluster import ClusterConfig
from rlvr.config.engine import EngineConfig
from rlvr.config.groups import AsyncConfig, DataConfig, EvalConfig, RolloutConfig, RunConfig, TrainConfig
from rlvr.config.parse import add_config_arguments, build_config, given_values
from rlvr.config.reward import RewardConfig
from rlvr.config.root import ALIASES, FIELDS, GROUPS, Config

__all__ = ["ALIASES", "FIELDS", "GROUPS", "AgentConfig", "AlgoConfig", "AsyncConfig", "ClusterConfig", "Config",
           "DataConfig", "EngineConfig", "EvalConfig", "RewardConfig", "RolloutConfig", "RunConfig", "TrainConfig",
           "add_config_arguments", "build_config", "given_values"]
