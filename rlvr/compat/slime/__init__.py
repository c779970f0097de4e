"""slime compatibility: slime's flags that rlvr spells differently (``flags``), slime-signature
plugins (``plugins``) and slime's dotted paths (``paths``).

Importing the package gives the registry slime's paths: ``--dynamic-sampling-filter-path
slime.rollout...check_reward_nonzero_std`` resolves to rlvr's ``nonzero_std``, and an import of
another ``slime.*`` path fails with a message naming rlvr's counterpart. Every config parse
imports this package (``rlvr.config.parse`` reads slime's flags).
"""

from rlvr.compat.slime.paths import slime_equivalent, slime_path_hint
from rlvr.core.registry import PATH_ALIASES, PATH_HINTS

if slime_equivalent not in PATH_ALIASES:
    PATH_ALIASES.append(slime_equivalent)
    PATH_HINTS.append(slime_path_hint)
