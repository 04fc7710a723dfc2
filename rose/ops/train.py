"""The train op (on the trainer worker) and the sync op (driven from the trainer).

After each update the trainer publishes the new version as hashed shards (in the engines' dtype);
the sync op then moves only what changed to every rollout worker (`rose.runtime.weights`).
"""
from __future__ import annotations

import pyarrow as pa

from rose.config import GRPOConfig
from rose.runtime.trajectory import concat


def train_step(cfg: GRPOConfig, *batches: pa.RecordBatch, publish_after_sync: int | None = None) -> dict:
    """Task: one GRPO update on all of the step's trajectories, then publish. Returns version, metrics.
    `publish_after_sync`: a weight version whose sync runs meanwhile (asynchronous mode: the previous
    step's); the new version is published only once that sync is done reading it."""
    import time

    from rose.worker import rose_worker

    w = rose_worker()
    if w.trainer is None:
        raise RuntimeError(f"worker {w.address} (role {w.role}) holds no trainer; was it prepared?")
    table = concat(list(batches))
    metrics = w.trainer.step(table, cfg)
    if w.trainer.version != w.weights.version:
        if publish_after_sync is not None:
            t_wait = time.perf_counter()
            w.weights.wait_synced(publish_after_sync)
            metrics["publish_wait_s"] = time.perf_counter() - t_wait
        t0 = time.perf_counter()
        w.weights.publish(w.trainer.model.state_dict(), w.trainer.version)
        metrics["publish_s"] = time.perf_counter() - t0
    return {"version": w.trainer.version, "metrics": metrics}


def train_metrics(result: dict) -> dict:
    """Task: the metrics of a train result (what the driver gathers)."""
    return dict(result["metrics"])


async def sync_weights(result: dict, receivers: tuple[str, ...]) -> dict:
    """Task (on the trainer): bring every rollout worker in `receivers` to the trained version."""
    from rose.runtime.weights.sync import sync_to
    from rose.worker import rose_worker

    w = rose_worker()
    try:
        if w.weights.version != result["version"]:
            raise RuntimeError(f"trainer publishes version {w.weights.version}, the train step made "
                               f"{result['version']}")
        # Receivers that left since the step was planned are skipped (Dask re-placed their rollouts).
        info = await w.worker.scheduler.identity(n_workers=-1)
        alive = [r for r in receivers if r in info["workers"]]
        status = await sync_to(w.worker, w.weights, alive)
    except BaseException as e:
        w.weights.mark_synced(result["version"], error=f"{type(e).__name__}: {e}")
        raise
    w.weights.mark_synced(result["version"])
    return status


async def catch_up(_prepared, receivers: tuple[str, ...]) -> dict:
    """Task (on the trainer): bring workers that joined mid-run to the trainer's current version."""
    from rose.runtime.weights.sync import sync_to
    from rose.worker import rose_worker

    w = rose_worker()
    return await sync_to(w.worker, w.weights, list(receivers))
