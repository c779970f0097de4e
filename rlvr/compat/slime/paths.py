"""slime's dotted paths: the ones rlvr has under a name of its own, and where the others live.

The builders and the config check pass ``slime_equivalent`` to the registries' lookups
(``rlvr.core.registry.resolve(..., alias=slime_equivalent)``); the config check
(``rlvr.config.root.check_slime_paths``) fails on the other ``slime.*`` paths with
``slime_path_hint``'s message.
"""

from __future__ import annotations

# slime's own functions rlvr has under another name: (the rlvr value for the same flag).
SLIME_PATHS = {
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std": "nonzero_std",
    "slime.rollout.rm_hub.dcpo_reward_post_process.dcpo_reward_post_process": "dcpo",
}
# Where the rest of slime's modules live in rlvr, by longest prefix.
SLIME_PREFIXES = {
    "slime.rollout.rm_hub": "a --rm-type name (docs/rewards.md: math, dapo, deepscaler, f1, gpqa, remote_rm, "
                            "boxed_*, dcpo, ...) or your own reward",
    "slime.rollout.filter_hub": "--dynamic-sampling-filter-path nonzero_std, or your filter importing "
                                "DynamicFilterOutput from rlvr.compat.slime.plugins",
    "slime.rollout.sglang_rollout": "the default rollout: drop the flag (rlvr.rollout.rollout), or "
                                    "--custom-generate-function-path for one sample's generation",
    "slime.utils.types": "rlvr.api (Sample, Status; defined in rlvr.core.types)",
    "slime.backends.megatron_utils.loss": "rlvr.algo (policy losses, TIS: --use-tis --tis-mode icepop, estimators)",
    "slime.rollout.data_source": "rlvr.data.dataset.DataSource (not replaceable yet: docs/slime_flags.md)",
    "slime": "rlvr's counterpart listed in docs/slime_flags.md",
}


def slime_equivalent(path: str) -> str | None:
    """The rlvr value for a known slime path (``None`` when it is not a slime path or has none)."""
    return SLIME_PATHS.get(path.replace(":", "."))


def slime_path_hint(path: str) -> str | None:
    """For a ``slime.*`` path: the message naming rlvr's equivalent; ``None`` for other paths."""
    dotted = path.replace(":", ".")
    if not (dotted == "slime" or dotted.startswith("slime.")):
        return None
    prefix = max((p for p in SLIME_PREFIXES if dotted == p or dotted.startswith(p + ".")), key=len)
    return (f"{path!r} is slime's code, which rlvr does not include; use {SLIME_PREFIXES[prefix]}. A plugin "
            "written against slime runs as it is once its imports name rlvr (docs/slime_flags.md)")
