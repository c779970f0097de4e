"""slime compatibility: slime's flags that rlvr spells differently (``flags``), slime-signature
plugins (``plugins``) and slime's dotted paths (``paths``).

Adapters at the edge: only the config (slime's flag names), the runtime's builders and the entry
points import this package (``scripts/import_cycles.py`` checks it), and importing it changes
nothing elsewhere. The builders pass ``paths.slime_equivalent`` to the registries' lookups
(``--dynamic-sampling-filter-path slime.rollout...check_reward_nonzero_std`` resolves to rlvr's
``nonzero_std``) and the config check names rlvr's counterpart of another ``slime.*`` path.
"""
