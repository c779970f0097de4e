"""Ray mode (``--ray``): the same loop, with its trainer and rollout as handles to actor groups.

    placement.py        one placement group: N training bundles (+ M engine bundles unless --colocate)
    train_group.py      TrainWorker ranks (torch.distributed, DDP / FSDP2) and the RayTrainer proxy
    rollout_manager.py  RolloutManager actor (data source, grader, Rollout) over M EngineActors; RayRollout proxy
    weight_sync.py      rank 0 -> object store -> engines, versioned, checksummed
    failures.py         the first actor failure stops the run, with its traceback

``start_on_ray(cfg)`` returns the driver's ``Components`` (``rlvr.runtime.build``) whose rollout and trainer
are proxies of the actor groups; the driver (``rlvr.runtime.loop.run``) calls ``close`` on every exit (normal
end, exception, Ctrl-C): actors killed, placement group removed, and the local Ray cluster stopped
when this run started it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from rlvr.runtime.build import Components
    from rlvr.config import Config

log = logging.getLogger(__name__)


def start_on_ray(cfg: Config) -> Components:
    """The run's components on Ray: training ranks and rollout engines as actors."""
    from rlvr.runtime.build import Components, check_fits_micro_batch, load_tokenizer, open_training_data, read_eval_sets

    tokenizer = load_tokenizer(cfg.train.hf_checkpoint)
    check_fits_micro_batch(cfg, open_training_data(cfg, tokenizer))  # refused before any actor starts
    rollout, trainer, close = start_actors(cfg)
    return Components(tokenizer, rollout, trainer, read_eval_sets(cfg), close)


def start_actors(cfg: Config) -> tuple[object, object, Callable[[], None]]:
    """(rollout proxy, trainer proxy, close) of the actor groups."""
    import ray
    from ray.util.placement_group import remove_placement_group

    from rlvr.distributed.placement import placement_group, plan, start
    from rlvr.distributed.rollout_manager import RayRollout
    from rlvr.distributed.train_group import RayTrainer

    t0 = time.perf_counter()
    p = plan(cfg.cluster, cfg.cluster.num_engines(cfg.engine.rollout_num_engines))
    started = start(cfg.cluster, p)
    parts: dict[str, object] = {}

    def close() -> None:
        for name in ("rollout", "trainer"):
            if name in parts:
                try:
                    parts[name].close()
                except Exception:  # already dead: nothing left to stop
                    log.debug("closing the %s actors failed", name, exc_info=True)
        if "pg" in parts:
            remove_placement_group(parts["pg"])
        if started:
            ray.shutdown()

    try:
        parts["pg"] = placement_group(p)
        cwd = os.getcwd()
        parts["trainer"] = RayTrainer(cfg, parts["pg"], p, cwd)
        parts["rollout"] = RayRollout(cfg, parts["pg"], p, cwd)
        parts["trainer"].setup()  # both sides load at once
        parts["rollout"].setup()
        if cfg.cluster.weight_sync == "broadcast":  # rank 0 and the engines form their group (broadcast.py)
            host, port = parts["trainer"].broadcast_address()
            joins = parts["trainer"].join_broadcast(host, port, parts["rollout"].num_engines + 1)
            parts["rollout"].join_broadcast(host, port, joins)
    except BaseException:
        close()
        raise
    c = cfg.cluster
    log.info("ray: %d %s training ranks and %d engines (%s, weights by %s) up in %.1f s", c.train_world_size,
             c.train_backend, parts["rollout"].num_engines, "colocated" if c.colocate else "disaggregated",
             c.weight_sync, time.perf_counter() - t0)
    return parts["rollout"], parts["trainer"], close
