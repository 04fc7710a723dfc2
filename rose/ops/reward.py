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

Functions of other shapes (verl's `compute_score`, TRL's reward functions) and weighted sums of several
are in `rose.ops.reward_shapes`; the same rules hold for each of their values.
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
from rose.ops.reward_shapes import Reward, Rewards, RowFailure, call, fn_name
from rose.runtime.trajectory import with_rewards

logger = logging.getLogger("rose.reward")

RewardFn = Callable[[pa.RecordBatch], Sequence[float]]


def env_reward(batch: pa.RecordBatch) -> Sequence[float]:
    """Default reward: what the environment paid out over the episode."""
    return batch.column("env_reward").to_pylist()


def as_reward(v) -> float | None:
    """`v` as a reward that survives the float32 reward column: a finite number, or None for anything
    else (NaN, inf, a float64 or int past float32's range, a string, None, an array)."""
    if type(v) is float or type(v) is int:
        if -3.4e38 < v < 3.4e38:  # inside float32's range (NaN fails both): the common case, no overflow
            return float(np.float32(v))
        if type(v) is float:
            return None
    if not isinstance(v, numbers.Real):
        return None
    try:
        with np.errstate(over="ignore"):  # past float32's range becomes inf: refused below
            f = np.float32(float(v))
    except (OverflowError, TypeError, ValueError):  # an int too large for a float, a broken __float__
        return None
    return float(f) if np.isfinite(f) else None


def _reason(message: str, tid: str, name: str, tail: str = "") -> str:
    """A failed row's `error`: the RewardError's text, naming the function and the trajectory."""
    return f"RewardError: {RewardError(message, trajectory_id=tid, reward_fn=name)}" + (f"\n{tail}" if tail else "")


def _score(term: Reward, scored: pa.RecordBatch) -> tuple[np.ndarray, list[str | None]]:
    """(rewards as float32, per-row failure reason or None) for the rows of `scored`."""
    ids = scored.column("trajectory_id").to_pylist()
    name = fn_name(term.fn)
    rewards = np.full(len(ids), np.nan, dtype=np.float32)
    try:
        values = call(term.shape, term.fn, scored)
    except Exception as e:
        tail = "".join(traceback.format_exception(e)[-3:])  # where in the function it broke
        msg = f"reward function {name!r} raised {type(e).__name__}: {e}"
        return rewards, [_reason(msg, tid, name, tail) for tid in ids]
    if len(values) != len(ids):
        msg = f"reward function {name!r} returned {len(values)} values for {len(ids)} trajectories"
        return rewards, [_reason(msg, tid, name) for tid in ids]
    reasons: list[str | None] = []
    for i, (tid, v) in enumerate(zip(ids, values)):
        if isinstance(v, RowFailure):
            reasons.append(_reason(f"reward function {name!r} {v.message} for trajectory {tid}", tid, name))
        elif (r := as_reward(v)) is None:
            reasons.append(_reason(f"reward function {name!r} returned {reprlib.repr(v)} for trajectory {tid}; "
                                   f"rewards must be finite numbers (float32)", tid, name))
        else:
            rewards[i] = r
            reasons.append(None)
    return rewards, reasons


def _terms(fn) -> tuple[tuple[Reward, ...], bool]:
    """(the terms to score, whether to keep each in reward_terms) for the reward op's `fn`."""
    if isinstance(fn, dict):
        fn = Rewards.of(fn)
    if isinstance(fn, Rewards):
        return fn.terms, True
    if isinstance(fn, Reward):
        return (fn,), False
    return (Reward(fn or env_reward),), False


def apply_reward(batch: pa.RecordBatch, fn: RewardFn | Reward | Rewards | dict | None = None) -> pa.RecordBatch:
    """Task: fill the reward column of `batch` with `fn` (default `env_reward`; a `Rewards`, or a dict
    `Rewards.of` takes: the weighted sum of its terms, each kept in reward_terms); rows it cannot score
    become failed with the reason (see the module docstring)."""
    terms, keep = _terms(fn)
    ok = pc.not_equal(batch.column("finish_reason"), "failed").to_numpy(zero_copy_only=False)
    rewards = np.full(batch.num_rows, np.nan, dtype=np.float32)
    per_row: list[dict] = [{} for _ in range(batch.num_rows)]
    if not ok.any():
        return with_rewards(batch, rewards, per_row if keep else None)
    scored = batch.filter(pa.array(ok))
    total = np.zeros(scored.num_rows, dtype=np.float32)
    reasons: list[str | None] = [None] * scored.num_rows
    for term in terms:
        values, why = _score(term, scored)
        with np.errstate(over="ignore", invalid="ignore"):  # NaN (failed) and overflow: handled below
            total += np.float32(term.weight) * values
        reasons = [r or w for r, w in zip(reasons, why)]  # a row keeps the first reason it failed for
        for row, v in zip(np.flatnonzero(ok), values):
            per_row[row][term.name] = float(v)
    # A weighted sum of finite float32 terms can still overflow float32: that row is failed, not inf.
    for i in np.flatnonzero(~np.isfinite(total)):
        if reasons[i] is None:
            tid = scored.column("trajectory_id")[i].as_py()
            reasons[i] = _reason(f"the weighted sum of reward terms {[t.name for t in terms]} is not finite "
                                 f"for trajectory {tid}", tid, "+".join(t.name for t in terms))
    failed_rows = [row for row, r in zip(np.flatnonzero(ok), reasons) if r is not None]
    rewards[ok] = np.where([r is None for r in reasons], total, np.nan)
    for row in failed_rows:
        per_row[row] = {}
    out = with_rewards(batch, rewards, per_row if keep else None)
    if not failed_rows:
        return out
    bad = [r for r in reasons if r is not None]
    logger.warning("reward function %r could not score %d of %d trajectories; they are failed: %s",
                   "+".join(t.name for t in terms), len(bad), len(reasons), bad[0].splitlines()[0])
    finish = batch.column("finish_reason").to_pylist()
    errors = batch.column("error").to_pylist()
    for row, reason in zip(np.flatnonzero(ok), reasons):
        if reason is not None:
            finish[row], errors[row] = "failed", reason
    out = out.set_column(out.schema.get_field_index("finish_reason"), out.schema.field("finish_reason"),
                         pa.array(finish, pa.string()))
    return out.set_column(out.schema.get_field_index("error"), out.schema.field("error"), pa.array(errors, pa.string()))
