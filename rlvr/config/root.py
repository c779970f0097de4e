"""The root ``Config``: one field per group, the rules between groups, and the index of every
field by its flat (slime) name.

Each component receives only its own group (``cfg.algo`` to algorithm code, ``cfg.rollout`` to the
rollout, ...). ``validate()`` checks every group, then the rules that span groups; each message
names the flag and what to change. A ``Config`` answers only its groups; the view by slime's flat
names that slime-style plugins get as ``args`` is built at the edge
(``rlvr.compat.slime.plugins.SlimeArgs``, by ``rlvr.runtime.plugins.slime_args``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from rlvr.compat.slime.paths import slime_equivalent, slime_path_hint
from rlvr.config.agent import AgentConfig
from rlvr.config.algo import AlgoConfig
from rlvr.config.cluster import ClusterConfig
from rlvr.config.engine import EngineConfig
from rlvr.config.engine_kinds import KINDS, EngineKind, resolve
from rlvr.config.fields import flag_of
from rlvr.config.groups import AsyncConfig, DataConfig, EvalConfig, RolloutConfig, RunConfig, TrainConfig
from rlvr.config.reward import RewardConfig
from rlvr.core.errors import ConfigError


GROUPS: dict[str, type] = {
    "data": DataConfig,
    "rollout": RolloutConfig,
    "engine": EngineConfig,
    "reward": RewardConfig,
    "algo": AlgoConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "asynchronous": AsyncConfig,
    "run": RunConfig,
    "cluster": ClusterConfig,
    "agent": AgentConfig,
}


# Fields that name a user function (``pkg.module:fn``) or a registered name.
PLUGIN_FIELDS = ("custom_generate_function_path", "rollout_function_path", "environment_path",
                 "custom_advantage_function_path", "custom_tis_function_path", "data_source_path",
                 "custom_reward_post_process_path", "dynamic_sampling_filter_path", "rollout_sample_filter_path",
                 "eval_function_path", "custom_rm_path")


def check_slime_paths(cfg: Config) -> None:
    """A plugin flag naming slime's own code (``slime.*``, not installed with rlvr) fails naming
    rlvr's counterpart; a slime path rlvr has under a name of its own passes (the builders
    resolve it to that name: ``rlvr.compat.slime.paths.slime_equivalent``)."""
    for group in GROUPS:
        for f in fields(getattr(cfg, group)):
            value = getattr(getattr(cfg, group), f.name)
            if f.name in PLUGIN_FIELDS and isinstance(value, str) and slime_equivalent(value) is None:
                hint = slime_path_hint(value)
                if hint is not None:
                    raise ConfigError(flag_of(f.name), hint)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    asynchronous: AsyncConfig = field(default_factory=AsyncConfig)
    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)

    # ---- derived numbers: rollout size, optimizer steps per rollout ------------------------
    @property
    def samples_per_rollout(self) -> int:
        return self.rollout.rollout_batch_size * self.rollout.n_samples_per_prompt

    @property
    def global_batch_size(self) -> int:
        return self.train.global_batch_size or self.samples_per_rollout

    @property
    def steps_per_rollout(self) -> int:
        return self.samples_per_rollout // self.global_batch_size

    def validate(self, rl: bool = True) -> Config:
        """Check every group, then the cross-group rules; ``rl=False`` (SFT) skips the RL-only ones.
        What needs the implementations is checked by ``rlvr.runtime.configure.check``."""
        check_slime_paths(self)  # before a group tries to import slime's code
        for group in GROUPS:  # each checks its declared bounds (rlvr.config.fields.check_bounds), then its rules
            getattr(self, group).validate()
        if self.data.prompt_data is None:
            raise ConfigError("--prompt-data", "is required: a JSONL or Parquet file, or a datasets directory, of prompts")
        gbs, total = self.global_batch_size, self.samples_per_rollout
        if gbs < 1 or total % gbs:
            raise ConfigError(
                "--global-batch-size",
                f"{gbs} must divide the samples of one rollout (--rollout-batch-size "
                f"{self.rollout.rollout_batch_size} x --n-samples-per-prompt "
                f"{self.rollout.n_samples_per_prompt} = {total})",
            )
        if self.train.use_dynamic_batch_size and self.train.max_tokens_per_gpu:
            # A response can be rollout_max_response_len long; the prompt needs room too.
            if self.train.max_tokens_per_gpu <= self.rollout.rollout_max_response_len:
                raise ConfigError(
                    "--max-tokens-per-gpu",
                    f"{self.train.max_tokens_per_gpu} cannot hold one response of --rollout-max-response-len "
                    f"{self.rollout.rollout_max_response_len} plus its prompt; raise it",
                )
        if not rl:
            if self.train.use_rollout_routing_replay:
                raise ConfigError("--use-rollout-routing-replay", "replays the routing a rollout engine recorded; "
                                  "SFT samples have none: drop it")
            return self
        if self.cluster.ray:
            self._validate_ray()
        if self.cluster.colocate:
            self._validate_colocate()
        self._validate_engine_kind()
        self._validate_agent()
        self._validate_async()
        self._validate_reference()
        self._validate_opd()
        return self

    def _validate_agent(self) -> None:
        """The multi-turn loops and the environment reward against the rest of the config."""
        if (self.agent.tools or self.agent.environment_path or self.agent.environment) and not self.data.apply_chat_template:
            raise ConfigError("--tools" if self.agent.tools else "--environment-path" if self.agent.environment_path
                              else "--environment",
                              "multi-turn chat needs --apply-chat-template (turns follow the chat template)")
        a = self.agent
        if ("environment" in [p.partition("=")[0].strip() for p in self.reward.rm_type.split(",")]
                and self.reward.custom_rm_path is None
                and not (a.environment or a.environment_path or a.custom_generate_function_path)):
            raise ConfigError("--rm-type", "'environment' is the reward an environment gave its episode: add "
                              "--environment or --environment-path, or drop it from --rm-type")
        if self.agent.rollout_function_path and self.agent.per_sample:
            raise ConfigError("--rollout-function-path", "replaces the whole rollout, so it cannot be combined with "
                              "a per-sample generate function (--custom-generate-function-path, --tools, --environment-path)")

    def _validate_reference(self) -> None:
        """The reference model's flags without a KL term; score centering against truncated sampling."""
        uses_ref = self.algo.use_kl_loss or self.algo.kl_coef != 0
        for name in ("ref_load", "ref_update_interval"):
            if getattr(self.train, name) is not None and not uses_ref:
                raise ConfigError(flag_of(name), "does nothing without a KL term; add --use-kl-loss or --kl-coef, or unset it")
        if self.algo.use_score_centering and (self.rollout.rollout_top_p != 1 or self.rollout.rollout_top_k != -1):
            raise ConfigError("--use-score-centering", "needs the untruncated sampling distribution (its head is q's top-k "
                              "of the full vocabulary): set --rollout-top-p 1 --rollout-top-k -1")

    def _validate_async(self) -> None:
        """``--async`` against the debug split and ``--deterministic-mode``."""
        if self.asynchronous.async_train and (self.run.debug_rollout_only or self.run.debug_train_only):
            raise ConfigError("--async", "overlaps sampling and training; the debug split (--debug-rollout-only, "
                              "--debug-train-only, --load-debug-rollout-data) runs one of them alone: drop one")
        if self.asynchronous.async_train and self.run.deterministic_mode:
            if self.cluster.ray:
                raise ConfigError("--deterministic-mode", "is not kept by --async under --ray (its producer runs on the "
                                  "rollout manager and applies weight pushes as they land); drop --async or --ray for "
                                  "a bit-for-bit repeatable run (docs/slime_flags.md)")
            if self.asynchronous.update_weights_interval != 1:
                raise ConfigError("--update-weights-interval", "must be 1 with --async --deterministic-mode: the "
                                  "pipelined producer samples rollout r with exactly version r - --max-staleness")

    def _validate_opd(self) -> None:
        """The OPD rules between the algorithm and reward groups: a served teacher is read from
        ``--rm-url``, which then cannot also be a remote reward model's."""
        if not self.algo.use_opd or self.algo.opd_type != "sglang":
            return
        if not self.reward.rm_url:
            raise ConfigError("--rm-url", "--opd-type sglang reads the teacher's log-probs from --rm-url: give the "
                                          "teacher engine's /generate URL (e.g. http://127.0.0.1:30000/generate)")
        if "remote_rm" in self.reward.rm_type:
            raise ConfigError("--rm-type", "remote_rm also reads --rm-url, which --opd-type sglang uses for the "
                                           "teacher; use a rule-based or judge reward, or --opd-type megatron")

    def _validate_colocate(self) -> None:
        """What cannot time-share a device with the trainer (both modes; rlvr.runtime.colocate, placement.py)."""
        local, e = not self.cluster.ray, self.engine
        refused = [
            ("--rollout-external-engine-addrs", local and bool(e.rollout_external_engine_addrs),
             "an external server keeps its own memory; drop --colocate (or the servers)"),
            ("--rollout-num-engines", local and e.uses_engine_processes,
             "rlvr serve processes keep their own memory; colocate one embedded engine (drop the flag)"),
            ("--async", local and self.asynchronous.async_train,
             "sampling and training overlap, so they cannot time-share the device; drop --colocate"),
            ("--debug-rollout-only", local and self.run.debug_rollout_only,
             "nothing trains, so there is nothing to time-share with; drop --colocate"),
            ("--update-weights-interval", self.asynchronous.update_weights_interval != 1,
             "a colocated engine is emptied while the trainer steps and reloaded after every step; use 1"),
        ]
        for flag, bad, why in refused:
            if bad:
                raise ConfigError(flag, f"with --colocate: {why}")

    @property
    def engine_kind(self) -> EngineKind:
        """The kind of engine that samples (``rlvr.config.engine_kinds``: resolved from the engine group)."""
        return resolve(self.engine, ray=self.cluster.ray)

    def _validate_engine_kind(self) -> None:
        """What the engine kind cannot honour (its traits: ``rlvr.config.engine_kinds``), refused before it starts."""
        t = KINDS[self.engine_kind]
        refused = [
            ("--ray", self.cluster.ray and not t.ray_actors),
            ("--colocate", self.cluster.colocate and not t.can_sleep),
            ("--deterministic-mode", self.run.deterministic_mode and not t.deterministic),
            ("--rollout-top-p", self.rollout.rollout_top_p != 1 and not t.truncated_sampling),
            ("--rollout-top-k", self.rollout.rollout_top_k != -1 and not t.truncated_sampling),
            ("--use-rollout-routing-replay", self.train.use_rollout_routing_replay and not t.routing_replay),
            ("--lora-rank", t.max_lora_rank is not None and self.train.lora_rank > t.max_lora_rank),
        ]
        for flag, bad in refused:
            if bad:
                why = t.why_not.get(flag, f"{t.what} cannot honour it")
                raise ConfigError(flag, f"with --rollout-engine {self.engine.rollout_engine}: {why}")

    def _validate_ray(self) -> None:
        """What ``--ray`` cannot do (yet), refused before any actor starts."""
        c, world = self.cluster, self.cluster.train_world_size
        # --weight-sync: a broadcast group is formed once, by the engines that exist at the start,
        # and pushed to by the driver between steps (rlvr/distributed/broadcast.py)
        static = {"--colocate": c.colocate, "--async": self.asynchronous.async_train,
                  "--use-fault-tolerance": self.engine.use_fault_tolerance}
        if c.weight_sync == "auto":
            c.weight_sync = "broadcast" if c.gpus_per_engine and not any(static.values()) else "object_store"
        elif c.weight_sync == "broadcast" and any(static.values()):
            flag = next(f for f, on in static.items() if on)
            raise ConfigError("--weight-sync", f"broadcast is formed once by the engines present at the start and "
                                               f"pushed to between steps, which {flag} does not allow; use "
                                               "object_store (or auto)")
        if self.global_batch_size % world:
            raise ConfigError("--global-batch-size", f"{self.global_batch_size} samples per optimizer step cannot be "
                                                     f"split evenly across {world} training ranks; make it a multiple of {world}")
        refused = [
            ("--rollout-external-engine-addrs", bool(self.engine.rollout_external_engine_addrs),
             "Ray engines are embedded engine actors; use external servers in local mode"),
            ("--debug-rollout-only", self.run.debug_rollout_only and c.colocate,
             "nothing trains, so there is nothing to time-share with; drop --colocate"),
            ("--bf16", self.train.bf16 and c.train_backend == "fsdp",
             "--train-backend fsdp keeps float32 parameters; drop --bf16 or use ddp"),
            ("--offload-train", c.offload_train and c.train_backend == "fsdp",
             "not built for FSDP2's sharded optimizer state yet; use ddp or drop it"),
            ("--ref-update-interval", self.train.ref_update_interval is not None and c.train_backend == "fsdp",
             "not supported with --train-backend fsdp yet; use ddp"),
            ("--kl-loss-type", self.algo.kl_loss_type == "token_level_kl" and c.train_backend == "fsdp"
             and bool(self.train.lora_rank or self.train.lora_adapter_path),
             "token_level_kl reads the reference's hidden states, which LoRA under --train-backend fsdp keeps "
             "sharded; use ddp or another --kl-loss-type"),
            ("--async", self.asynchronous.async_train and c.colocate,
             "sampling and training overlap, so they cannot time-share bundles; drop --colocate"),
            ("--check-weight-update-equal", self.asynchronous.async_train and c.check_weight_update_equal,
             "not checked on the producer's asynchronous weight pushes yet; drop it or --async"),
        ]
        for flag, bad, why in refused:
            if bad:
                raise ConfigError(flag, f"under --ray: {why}")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {g: dataclasses.asdict(getattr(self, g)) for g in GROUPS}

    def save_yaml(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path


def _field_index() -> dict[str, tuple[str, dataclasses.Field]]:
    """field name -> (group, Field), checking names are unique across groups."""
    index: dict[str, tuple[str, dataclasses.Field]] = {}
    for group, cls in GROUPS.items():
        for f in fields(cls):
            if f.name in index:
                raise RuntimeError(f"config field {f.name!r} defined in both {index[f.name][0]} and {group}")
            index[f.name] = (group, f)
    return index


FIELDS = _field_index()
# Fields whose flag is not derived from the name (``async_train`` is ``--async``): YAML takes either.
ALIASES = {f.metadata["flag"][2:].replace("-", "_"): name for name, (_, f) in FIELDS.items() if "flag" in f.metadata}
