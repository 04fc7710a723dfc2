"""What the placement book returns to its caller (`Shed`, `Dispatch`) and what it keeps for people
(`LogEntry`, the event log; `Sample`, the per-worker history the dashboard draws)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Shed:
    """Ask one worker to give rollout tasks back at their next turn boundary."""

    worker: str  # address of the worker
    keys: tuple[str, ...]  # rollout task keys (newest first; to migrate, oldest first)
    # "over-slots" (more sequences than slots for shed_after_s; only what other workers have room for) |
    # "training" (colocated: everything, and the continuations keep their affinity to this worker) |
    # "migrate" (the tail moves to dedicated workers with room). Over-slots and migrating continuations
    # keep no affinity to this worker: they go where the room is.
    reason: str


@dataclass(frozen=True)
class Dispatch:
    """Room or work may have appeared: run `dispatch` soon (never from inside the event that asked)."""

    stimulus_id: str  # the event that made it due


Instruction = Shed | Dispatch


class LogEntry(NamedTuple):
    """One line of the event log (a tuple, so that snapshots stay plain data)."""

    time: float  # the event's `now` (s)
    kind: str  # joined | refused | removed | shed | migrate | training | warning
    worker: str  # address it concerns ("" for none)
    detail: str  # what happened, for people
    stimulus_id: str  # the event that caused it


class Sample(NamedTuple):
    """One rollout worker at one tick (a tuple, so that the dashboard reads plain data)."""

    time: float  # the tick's `now` (s)
    worker: str  # address
    role: str  # dedicated | serving
    slots: int  # rollout sequences it could run then
    used: int  # sequences of its placed, unfinished tasks
    slo_met: int | None  # serving workers: requests completed inside the SLO, cumulative
    slo_requests: int | None  # serving workers: requests completed, cumulative
