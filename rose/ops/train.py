"""The train op (on the trainer worker) and the sync op (on each rollout worker).

Sync here is the simplest correct path: the full weights, versioned, through Dask's own data
transfer from the trainer to every rollout worker, applied between engine iterations.
"""
from __future__ import annotations

import pyarrow as pa

from rose.config import GRPOConfig
from rose.runtime.trajectory import concat


def train_step(cfg: GRPOConfig, *batches: pa.RecordBatch) -> dict:
    """Task: one GRPO update on all of the step's trajectories. Returns version, weights, metrics."""
    from rose.worker import rose_worker

    w = rose_worker()
    if w.trainer is None:
        raise RuntimeError(f"worker {w.address} (role {w.role}) holds no trainer; was it prepared?")
    table = concat(list(batches))
    metrics = w.trainer.step(table, cfg)
    return {"version": w.trainer.version, "weights": w.trainer.state_dict(), "metrics": metrics}


def train_metrics(result: dict) -> dict:
    """Task: the metrics of a train result, without its weights (what the driver gathers)."""
    return dict(result["metrics"])


def apply_weights(result: dict) -> dict:
    """Task: load the trained weights into this worker's engine; returns the version it now holds."""
    import time

    from rose.worker import rose_worker

    w = rose_worker()
    t0 = time.perf_counter()
    w.loop.load_weights(result["weights"], result["version"]).result()
    return {"worker": w.address, "weight_version": w.loop.weight_version, "sync_s": time.perf_counter() - t0}
