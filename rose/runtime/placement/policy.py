"""Where waiting rollout tasks go: a pure function of a snapshot (no I/O, no clock, no Dask).

The scheduler's placement book (`rose.runtime.scheduler.book`) builds `WorkerSlot`s from what workers
report and what the scheduler has in flight, calls `place`, and the plugin acts on the assignments;
the tests call `place` directly.

Capacity is counted in rollout sequences (trajectories), not tasks: a task is a GRPO group of
`width` trajectories, and a serving worker's spare capacity is what its co-serving executor can
batch next to online traffic without breaking the serving SLO.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rose.config import POLICIES
from rose.errors import config_check

# Which worker roles take rollouts under each policy. The baselines use dedicated workers only;
# `elastic` differs from `fixed` in its scaler (rose.runtime.placement.elastic), not here.
ROLES_OF_POLICY = {"rose": ("dedicated", "serving"), "fixed": ("dedicated",), "elastic": ("dedicated",)}
_RANK = {"dedicated": 0, "serving": 1}  # dedicated workers first


@dataclass(frozen=True)
class WorkerSlot:
    """One rollout worker as the placement sees it."""

    address: str
    role: str  # dedicated | serving
    slots: int  # rollout sequences it can run at once right now (a serving worker's rises and falls)
    used: int = 0  # sequences of placed, unfinished tasks
    weight_version: int = -1  # version its engine holds; -1 before it is prepared

    @property
    def free(self) -> int:
        return self.slots - self.used


@dataclass(frozen=True)
class RolloutTask:
    """One waiting rollout task."""

    key: str
    width: int = 1  # trajectories it runs at once (sequences it takes on a worker)
    min_version: int = 0  # never on an engine behind this weight version
    group: str = ""  # fairness unit (pipeline and step): groups take turns for scarce slots
    affinity: str | None = None  # worker holding its prefix in cache (a continuation's last worker)

    def __post_init__(self):
        config_check(self.width >= 1, "RolloutTask", "width", self.width, ">= 1")


@dataclass(frozen=True)
class Assignment:
    key: str
    worker: str
    reason: str  # "affinity" | "dedicated" | "serving"


def fair_order(tasks: Sequence[RolloutTask]) -> list[RolloutTask]:
    """Round-robin across groups, each group in the order given (its own priority order).

    Groups take turns in the order of their first task, so the oldest step leads each round.
    """
    groups: dict[str, list[RolloutTask]] = {}
    for t in tasks:
        groups.setdefault(t.group, []).append(t)
    if len(groups) <= 1:
        return list(tasks)
    queues = list(groups.values())
    out: list[RolloutTask] = []
    for i in range(max(len(q) for q in queues)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def place(tasks: Sequence[RolloutTask], workers: Iterable[WorkerSlot], policy: str = "rose") -> list[Assignment]:
    """Assign as many waiting tasks as fit; the rest keep waiting.

    Rules: a task goes only to a worker of a role the policy allows, whose engine holds at least the
    task's weight version, and whose free slots cover the task's width. Its affinity worker wins when
    it qualifies; otherwise dedicated workers come before serving workers, and among a role the worker
    with the most free slots (load spreads, and on serving workers the most spare capacity is used
    first). Groups take turns (`fair_order`).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}; choose one of {list(POLICIES)}")
    roles = ROLES_OF_POLICY[policy]
    by_addr = {w.address: w for w in workers if w.role in roles and w.free > 0}
    free = {a: w.free for a, w in by_addr.items()}
    # One heap per distinct minimum version among the tasks (few: usually one), holding the workers
    # at or above it, keyed (role rank, -free, address). Entries go stale when a worker's free count
    # changes; a fresh entry is pushed then, and a popped entry whose count no longer matches is dropped.
    heaps: dict[int, list[tuple[int, int, str]]] = {}
    # Smallest width that found no worker, per version: capacity only shrinks within one call, so a
    # task at least that wide cannot fit either (keeps a long unplaceable tail at O(1) a task).
    no_fit: dict[int, int] = {}

    def heap_for(version: int) -> list:
        h = heaps.get(version)
        if h is None:
            h = [(_RANK[w.role], -free[a], a) for a, w in by_addr.items() if w.weight_version >= version]
            heapq.heapify(h)
            heaps[version] = h
        return h

    def take(addr: str, width: int) -> None:
        free[addr] -= width
        if free[addr] > 0:
            w = by_addr[addr]
            for version, h in heaps.items():
                if w.weight_version >= version:
                    heapq.heappush(h, (_RANK[w.role], -free[addr], addr))

    out: list[Assignment] = []
    for t in fair_order(tasks):
        a = t.affinity
        if a is not None and a in by_addr and by_addr[a].weight_version >= t.min_version and free[a] >= t.width:
            take(a, t.width)
            out.append(Assignment(t.key, a, "affinity"))
            continue
        if t.width >= no_fit.get(t.min_version, 1 << 62):
            continue
        h = heap_for(t.min_version)
        skipped = []
        chosen = None
        while h:
            entry = heapq.heappop(h)
            rank, neg_free, addr = entry
            if -neg_free != free[addr]:
                continue  # stale
            if free[addr] >= t.width:
                chosen = addr
                break
            skipped.append(entry)  # too full for this task; may fit a narrower one
        for entry in skipped:
            heapq.heappush(h, entry)
        if chosen is None:
            no_fit[t.min_version] = min(t.width, no_fit.get(t.min_version, 1 << 62))
            continue
        take(chosen, t.width)
        out.append(Assignment(t.key, chosen, by_addr[chosen].role))
    return out


@dataclass(frozen=True)
class InFlight:
    """A placed, unfinished rollout task on one worker (for shedding)."""

    key: str
    width: int
    placed_at: float  # when it started on its worker (s, the plugin's clock); the newest is shed first
    min_version: int = 0  # the weight version a worker taking it over must hold


# A worker over its slots still runs what it holds, only slower (a serving worker's executor admits what
# its SLO leaves room for, and the rest waits inside it with its tokens kept). Giving a task back helps
# only where another worker can start it now: shed into a queue with no room anywhere, it waits just the
# same, pays a continuation (a re-prefill elsewhere), and, when its old worker recovers first, goes
# back there (elastic_e2e: 150 of 210 placements on a serving worker whose offer dips with every burst
# ended in a shed).
def plan_shed(running: Sequence[InFlight], slots: int, others: Sequence[WorkerSlot] | None = None,
              held: int = 0) -> list[str]:
    """Which running tasks a worker gives back so that what stays fits `slots`: newest first (they have
    the least progress to carry over), as few as possible.

    `others`: the workers that could take them over (the policy's roles, the worker itself left out);
    a task is given back only if one of them has free slots for its width at its weight version (the
    one with most room counts it taken), less `held` sequences already on their way there. None: no
    such bound (a colocated worker yielding its device to training gives everything back).
    """
    used = sum(r.width for r in running)
    room = None if others is None else _room(others, held)
    out = []
    for r in sorted(running, key=lambda r: (r.placed_at, r.key), reverse=True):
        if used <= slots:
            break
        if room is not None:
            fits = [i for i, (free, version) in enumerate(room) if free >= r.width and version >= r.min_version]
            if not fits:
                continue
            i = max(fits, key=lambda i: room[i][0])
            room[i] = (room[i][0] - r.width, room[i][1])
        out.append(r.key)
        used -= r.width
    return out


def _room(others: Sequence[WorkerSlot], held: int) -> list[tuple[int, int]]:
    """(free slots, weight version) of each worker, `held` sequences taken from the roomiest first."""
    room = sorted(((w.free, w.weight_version) for w in others if w.free > 0), reverse=True)
    for i, (free, version) in enumerate(room):
        take = min(free, held)
        room[i], held = (free - take, version), held - take
    return room


@dataclass(frozen=True)
class Running:
    """A placed, unfinished rollout task, for moving the tail (see `plan_migrate`)."""

    key: str
    worker: str
    width: int
    placed_at: float  # when it started there (s); the oldest has made the most progress


def plan_migrate(running: Sequence[Running], workers: Iterable[WorkerSlot], waiting: int) -> list[Assignment]:
    """Move the tail of a step off serving workers once dedicated workers have room and nothing waits.

    A serving worker steps its rollout engine once per serving iteration, so each rollout token there
    costs a serving step too: near the end of a step, the longest groups left on serving workers set
    the step's time while dedicated workers sit idle. With no task waiting (`waiting` = 0), the oldest
    groups on serving workers (most progress made: the likeliest long tail) go, as continuations, to
    the dedicated workers with the most free slots, but only into a batch no larger than the one they
    leave (a busier dedicated worker could step them slower). Returns (key, dedicated worker) assignments.
    """
    if waiting:
        return []
    roles = {w.address: w.role for w in workers}
    used = {w.address: w.used for w in workers}
    free = {w.address: w.free for w in workers if w.role == "dedicated" and w.free > 0}
    out = []
    for r in sorted((r for r in running if roles.get(r.worker) == "serving"), key=lambda r: (r.placed_at, r.key)):
        if not free:
            break
        fits = [a for a in free if free[a] >= r.width and used[a] + r.width <= used.get(r.worker, 0)]
        if not fits:
            continue
        dst = max(fits, key=lambda a: (free[a], a))
        out.append(Assignment(r.key, dst, "migrate"))
        free[dst] -= r.width
        used[dst] += r.width
        used[r.worker] -= r.width
        if free[dst] <= 0:
            del free[dst]
    return out
