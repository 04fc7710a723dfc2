"""The reward op and the reward-function contract.

A reward function takes a RecordBatch of finished trajectories (trajectory schema) and returns one
float per row, in order. The default, `env_reward`, is the sum of the rewards the environment gave.
Failed trajectories are not passed to the function; their reward stays NaN and the trainer skips them.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rose.errors import RewardError
from rose.runtime.trajectory import with_rewards

RewardFn = Callable[[pa.RecordBatch], Sequence[float]]


def env_reward(batch: pa.RecordBatch) -> Sequence[float]:
    """Default reward: what the environment paid out over the episode."""
    return batch.column("env_reward").to_pylist()


def apply_reward(batch: pa.RecordBatch, fn: RewardFn | None = None) -> pa.RecordBatch:
    """Task: fill the reward column of `batch` with `fn` (default `env_reward`)."""
    fn = fn or env_reward
    ok = pc.not_equal(batch.column("finish_reason"), "failed").to_numpy(zero_copy_only=False)
    rewards = np.full(batch.num_rows, np.nan, dtype=np.float32)
    if ok.any():
        scored = batch.filter(pa.array(ok))
        values = list(fn(scored))
        ids = scored.column("trajectory_id").to_pylist()
        if len(values) != len(ids):
            raise RewardError(f"reward function {getattr(fn, '__name__', fn)!r} returned {len(values)} values "
                              f"for {len(ids)} trajectories", trajectory_ids=ids)
        for tid, v in zip(ids, values):
            if not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(float(v)):
                raise RewardError(f"reward function {getattr(fn, '__name__', fn)!r} returned {v!r} "
                                  f"for trajectory {tid}; rewards must be finite numbers", trajectory_id=tid)
        rewards[ok] = np.asarray(values, dtype=np.float32)
    return with_rewards(batch, rewards)
