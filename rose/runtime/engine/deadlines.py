"""Turn deadlines kept by the thread that steps the engine: a rollout turn not answered in its
`request_timeout_s` fails, as `asyncio.timeout` around the await would make it fail, at a fraction of
the cost.

Why not `asyncio.timeout` on every turn: each one schedules and cancels a timer on the loop (a
`TimerHandle` pushed on the loop's heap, compared in Python, and popped again once cancelled), on the
engine's thread, between two iterations. Here a turn costs one tuple appended to a list; one timer per
loop sweeps the list at the earliest deadline, or after SWEEP_S at the latest (which bounds the list to
the turns of the last SWEEP_S), drops the turns answered since and fails the ones past their deadline.
Measured (256 guess episodes a round, about 1,200 turns): on an instant engine, with a worker's garbage
collector settings, a turn's Python on the loop took 25-27 us against 28.6-29.0 with a timer per turn
(alternated runs); `benchmarks/rollout_overhead.py` (24 rounds, three runs of each, alternated) gave
0.846-0.861 of vLLM called directly against 0.834-0.839.
"""
from __future__ import annotations

import asyncio
from typing import Callable

SWEEP_S = 1.0  # the list is swept at least this often while it holds turns


class Deadlines:
    """Deadlines of the turns in flight on one event loop (its thread only)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[str, asyncio.Future, float], None]):
        """`expire(request_id, future, timeout_s)` is called on the loop's thread for each turn whose future is
        not done by its deadline: it fails the future and drops the request."""
        self._loop = loop
        self._expire = expire
        self._turns: list[tuple[float, asyncio.Future, str, float]] = []  # (deadline, future, id, timeout_s)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # loop-clock seconds the timer fires at

    def add(self, request_id: str, fut: asyncio.Future, timeout_s: float) -> None:
        deadline = self._loop.time() + timeout_s
        self._turns.append((deadline, fut, request_id, timeout_s))
        if self._timer is None or deadline < self._timer_at:
            self._arm(min(deadline, self._loop.time() + SWEEP_S))

    def __len__(self) -> int:
        return len(self._turns)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._turns.clear()

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(when, self._sweep), when

    def _sweep(self) -> None:
        self._timer = None
        now = self._loop.time()
        alive = [t for t in self._turns if not t[1].done()]
        self._turns = [t for t in alive if t[0] > now]
        for deadline, fut, rid, timeout_s in alive:
            if deadline <= now:
                self._expire(rid, fut, timeout_s)
        if self._turns:
            self._arm(min(min(t[0] for t in self._turns), now + SWEEP_S))


def timeout_message(timeout_s: float) -> str:
    """The reason a turn past its deadline fails with (engine_calls.generate_turn says the same)."""
    return f"no answer from the engine in {timeout_s:g} s (request_timeout_s)"
