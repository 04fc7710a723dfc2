"""The reward op and the reward-function contract.

A reward function takes a RecordBatch of finished trajectories (trajectory schema) and returns one
finite number per row, in order. The default, `env_reward`, is the sum of the rewards the environment
gave. Failed trajectories are not passed to the function; their reward stays NaN and the trainer
skips them (it trains only on rows whose finish_reason is not "failed").

A broken reward function costs the trajectories it could not score, never the step: a row it scores
NaN, inf (also once stored as float32) or not a number is marked failed with a reason naming the
function and the trajectory; a function that raises, or returns the wrong number of values, fails
every row it was given with that reason. Those rows keep reward NaN, are not trained on, and count in
the step's `failed`. So the train step never sees a NaN reward, and a judge that chokes on one answer
in a days-long run does not stop it.
"""
from __future__ import annotations

import logging
import numbers
import reprlib
import traceback
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rose.errors import RewardError
from rose.runtime.trajectory import with_rewards

logger = logging.getLogger("rose.reward")

RewardFn = Callable[[pa.RecordBatch], Sequence[float]]


def env_reward(batch: pa.RecordBatch) -> Sequence[float]:
    """Default reward: what the environment paid out over the episode."""
    return batch.column("env_reward").to_pylist()


def as_reward(v) -> float | None:
    """`v` as a reward that survives the float32 reward column: a finite number, or None for anything
    else (NaN, inf, a float64 or int past float32's range, a string, None, an array)."""
    if not isinstance(v, numbers.Real):
        return None
    try:
        with np.errstate(over="ignore"):  # past float32's range becomes inf: refused below
            f = np.float32(float(v))
    except (OverflowError, TypeError, ValueError):  # an int too large for a float, a broken __float__
        return None
    return float(f) if np.isfinite(f) else None


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _reason(message: str, tid: str, name: str, tail: str = "") -> str:
    """A failed row's `error`: the RewardError's text, naming the function and the trajectory."""
    return f"RewardError: {RewardError(message, trajectory_id=tid, reward_fn=name)}" + (f"\n{tail}" if tail else "")


def _score(fn: RewardFn, scored: pa.RecordBatch) -> tuple[np.ndarray, list[str | None]]:
    """(rewards as float32, per-row failure reason or None) for the rows of `scored`."""
    ids = scored.column("trajectory_id").to_pylist()
    name = _name(fn)
    rewards = np.full(len(ids), np.nan, dtype=np.float32)
    try:
        values = list(fn(scored))
    except Exception as e:
        tail = "".join(traceback.format_exception(e)[-3:])  # where in the function it broke
        msg = f"reward function {name!r} raised {type(e).__name__}: {e}"
        return rewards, [_reason(msg, tid, name, tail) for tid in ids]
    if len(values) != len(ids):
        msg = f"reward function {name!r} returned {len(values)} values for {len(ids)} trajectories"
        return rewards, [_reason(msg, tid, name) for tid in ids]
    reasons: list[str | None] = []
    for i, (tid, v) in enumerate(zip(ids, values)):
        r = as_reward(v)
        if r is None:
            reasons.append(_reason(f"reward function {name!r} returned {reprlib.repr(v)} for trajectory {tid}; "
                                   f"rewards must be finite numbers (float32)", tid, name))
        else:
            rewards[i] = r
            reasons.append(None)
    return rewards, reasons


def apply_reward(batch: pa.RecordBatch, fn: RewardFn | None = None) -> pa.RecordBatch:
    """Task: fill the reward column of `batch` with `fn` (default `env_reward`); rows `fn` cannot score
    become failed with the reason (see the module docstring)."""
    fn = fn or env_reward
    ok = pc.not_equal(batch.column("finish_reason"), "failed").to_numpy(zero_copy_only=False)
    rewards = np.full(batch.num_rows, np.nan, dtype=np.float32)
    if not ok.any():
        return with_rewards(batch, rewards)
    scored_rewards, reasons = _score(fn, batch.filter(pa.array(ok)))
    rewards[ok] = scored_rewards
    bad = [r for r in reasons if r is not None]
    if not bad:
        return with_rewards(batch, rewards)
    logger.warning("reward function %r could not score %d of %d trajectories; they are failed: %s", _name(fn),
                   len(bad), len(reasons), bad[0].splitlines()[0])
    finish = batch.column("finish_reason").to_pylist()
    errors = batch.column("error").to_pylist()
    for row, reason in zip(np.flatnonzero(ok), reasons):
        if reason is not None:
            finish[row], errors[row] = "failed", reason
    out = with_rewards(batch, rewards)
    out = out.set_column(out.schema.get_field_index("finish_reason"), out.schema.field("finish_reason"),
                         pa.array(finish, pa.string()))
    return out.set_column(out.schema.get_field_index("error"), out.schema.field("error"), pa.array(errors, pa.string()))
