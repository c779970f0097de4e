"""Weight sync under Ray: trainer rank 0 -> M engine actors (object store or broadcast), for the ~20M model.

Starts a local Ray cluster with 2 DDP training ranks and 2 embedded engines (disaggregated),
then times ``rollout.update_weights(trainer.weights(), version)`` -- exactly what the loop times
as ``perf/update_weights_time`` -- with and without ``--check-weight-update-equal`` (which also
checksums both ends and compares). Prints the median of ``--repeats`` syncs and the bytes one
sync moves. ``--lora-rank R`` trains LoRA adapters: only they are synced; run it with
and without to compare.

    .venv/bin/python benchmarks/weight_sync.py [--model 20m] [--engines 2] [--repeats 5] [--lora-rank 16]
        [--weight-sync object_store|broadcast]

``--local``: no Ray; local mode's path (``trainer.weights()`` into an embedded engine in the same
process), full weights against LoRA adapters of ``--lora-rank`` (default 16) side by side.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from benchmarks.common import model_dir


def local(model: str, rank: int, repeats: int) -> None:
    """Local mode: full-weight sync vs LoRA-adapter sync into the embedded engine, bytes and time."""
    from benchmarks.common import set_threads

    set_threads(1)
    from rlvr.algo import AlgoConfig
    from rlvr.config import TrainConfig
    from rlvr.engine.local.embedded import EmbeddedEngine
    from rlvr.train.trainer import Trainer

    ckpt = model_dir(model, tempfile.mkdtemp(prefix="rlvr-weight-sync-"))
    rows = {}
    for r in (0, rank):
        trainer = Trainer(TrainConfig(hf_checkpoint=str(ckpt), lr=1e-5, lora_rank=r), AlgoConfig())
        engine = EmbeddedEngine(trainer.model, pad_token_id=0)
        times = []
        for version in range(1, repeats + 1):
            t = time.perf_counter()
            sent = trainer.weights()
            engine.update_weights(sent, version)
            times.append(time.perf_counter() - t)
        n_bytes = sum(v.numel() * v.element_size() for v in sent.values())
        rows[r] = (n_bytes, statistics.median(times))
        what = f"LoRA rank {r} adapters" if r else "full weights"
        print(f"{model} {what}: {len(sent)} tensors, {n_bytes / 2**20:.2f} MiB per sync, "
              f"median {statistics.median(times) * 1e3:.1f} ms over {repeats}")
    (fb, ft), (lb, lt) = rows[0], rows[rank]
    print(f"LoRA rank {rank} sync: {fb / lb:.0f}x fewer bytes, {ft / lt:.1f}x faster")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--local", action="store_true", help="no Ray: full vs LoRA sync into an embedded engine")
    ap.add_argument("--model", default="20m")
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--backend", default="ddp", choices=["ddp", "fsdp"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--weight-sync", default="object_store", choices=["object_store", "broadcast"],
                    help="rank 0 -> object store -> engines, or a broadcast group (gloo on CPU)")
    a = ap.parse_args()
    if a.local:
        return local(a.model, a.lora_rank or 16, a.repeats)

    from rlvr.runtime.configure import parse_config
    from rlvr.data.arith import make_splits, write_jsonl
    from rlvr.distributed import start_on_ray

    root = tempfile.mkdtemp(prefix="rlvr-weight-sync-")
    ckpt = model_dir(a.model, root)
    prompts = write_jsonl(make_splits(n_test=10)[0][:50], f"{root}/train.jsonl")
    cfg = parse_config(["--hf-checkpoint", str(ckpt), "--prompt-data", str(prompts), "--rollout-batch-size", "2",
                        "--n-samples-per-prompt", "2", "--ray", "--actor-num-cpu-workers-per-node", str(a.ranks),
                        "--rollout-num-engines", str(a.engines), "--train-backend", a.backend,
                        "--lora-rank", str(a.lora_rank), "--weight-sync", a.weight_sync])
    t0 = time.perf_counter()
    c = start_on_ray(cfg)
    rollout, trainer, close = c.rollout, c.trainer, c.close
    print(f"ray up: {a.ranks} {a.backend} ranks + {a.engines} engines, weights by {a.weight_sync}, "
          f"in {time.perf_counter() - t0:.1f} s")
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        n_params = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ckpt)).parameters())
        print(f"model {a.model}: {n_params / 1e6:.1f}M parameters, {n_params * 4 / 2**20:.0f} MiB float32")
        import ray

        if a.weight_sync == "object_store":
            sent = ray.get(trainer.weights().weights)
            n_bytes = sum(v.nbytes for v in sent.values())
            print(f"one sync moves {len(sent)} tensors, {n_bytes / 2**20:.2f} MiB "
                  f"({'LoRA rank %d adapters' % a.lora_rank if a.lora_rank else 'every weight'})")
        version = 0
        for check in (False, True):
            trainer.cfg.cluster.check_weight_update_equal = check
            times = []
            for _ in range(a.repeats):
                version += 1
                t = time.perf_counter()
                rollout.update_weights(trainer.weights(), version)
                times.append(time.perf_counter() - t)
            sums = rollout.last_checksums
            verdict = f"checksums equal on all {len(sums)} engines" if check else "no checksum"
            print(f"update_weights ({verdict}): median {statistics.median(times) * 1e3:.0f} ms, "
                  f"min {min(times) * 1e3:.0f} ms, max {max(times) * 1e3:.0f} ms over {a.repeats}")
    finally:
        close()


if __name__ == "__main__":
    main()
