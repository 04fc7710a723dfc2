"""DAPO's decisions, as pure functions of a step's rewards: which groups carry a learning signal, how
many more to roll out, and the overlong penalty. The driver (`rose.step`) and the trainer
(`rose.runtime.trainer`) call the same functions, so they agree on what is kept.
"""
from __future__ import annotations

import math

import numpy as np


def varied_groups(group_ids, rewards, ok) -> set[int]:
    """The groups whose rewards vary over their trajectories that did not fail (two or more of them).

    group_ids, rewards, ok: (N,) per trajectory. A group whose rewards are all equal has advantage 0
    for every sample: it teaches nothing, and in a token-level mean it only dilutes the others."""
    group_ids, rewards, ok = np.asarray(group_ids), np.asarray(rewards, dtype=np.float64), np.asarray(ok, dtype=bool)
    kept = set()
    for g in np.unique(group_ids[ok]):
        r = rewards[ok & (group_ids == g)]
        if len(r) >= 2 and np.ptp(r) > 0:
            kept.add(int(g))
    return kept


def more_groups(target: int, sampled: int, kept: int, rounds: int, max_rounds: int) -> int:
    """How many groups to roll out next so the step has `target` varied ones (0: stop).

    `sampled` groups so far in `rounds` rounds, `kept` of them varied. The next round asks for the
    shortfall divided by the kept fraction seen so far (so one round usually fills the batch), at
    most `target` and at least 1; with nothing kept yet, `target` again."""
    if kept >= target or rounds >= max_rounds:
        return 0
    need = target - kept
    if kept == 0:
        return target
    return max(1, min(target, math.ceil(need * sampled / kept)))


def overlong_penalty(lengths, max_tokens: int, buffer: int, penalty: float) -> np.ndarray:
    """(N,) generated tokens per trajectory -> (N,) reward shaping, <= 0 (DAPO's soft overlong
    punishment): 0 up to `max_tokens - buffer`, then falling linearly to `-penalty` at `max_tokens`,
    and `-penalty` past it. `max_tokens` 0: no shaping."""
    lengths = np.asarray(lengths, dtype=np.float64)
    if max_tokens <= 0:
        return np.zeros_like(lengths)
    start = max_tokens - buffer
    if buffer == 0:
        return np.where(lengths > max_tokens, -penalty, 0.0)
    return -penalty * np.clip((lengths - start) / buffer, 0.0, 1.0)
