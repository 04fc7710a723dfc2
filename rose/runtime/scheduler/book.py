"""The placement book: what the scheduler's placement plugin knows about rollout workers and rollout
tasks, and what it decides, as plain data without Dask.

Each event is a method that takes the `stimulus_id` of its cause (recorded in the event log) and
returns records for the caller to act on: `Shed` (ask a worker to give tasks back), `Dispatch` (run
`dispatch` soon), or, from `dispatch`, the policy's `Assignment`s. The book sends nothing and reads no
clock: times come in as `now` (seconds of one clock, which also stamps the event log and history), and
which workers Dask counts as running comes in as `running` (anything that answers `addr in running`).
"""
from __future__ import annotations

import collections
import logging
from collections.abc import Container

from rose.config import POLICIES
from rose.runtime.placement import Assignment, InFlight, RolloutTask, WorkerSlot, place, plan_shed
from rose.runtime.placement.policy import ROLES_OF_POLICY, Running, plan_migrate
from rose.runtime.protocol import ROLES, WorkerReport, group_of
from rose.runtime.scheduler.records import Dispatch, Instruction, LogEntry, Sample, Shed

__all__ = ["Dispatch", "Instruction", "LogEntry", "PlacementBook", "Sample", "Shed"]

logger = logging.getLogger("rose.scheduler")


class PlacementBook:
    """The rollout workers' latest reports and the managed rollout tasks, where they run, and what was
    decided about them. `now`: when the book starts (s); `history_len`: samples kept (default: 10
    minutes of 8 workers at 4 ticks a second); `events_len`: event log lines kept."""

    def __init__(self, policy: str = "rose", shed_after_s: float = 0.5, now: float = 0.0,
                 history_len: int = 19200, events_len: int = 1000, migrate: bool = False):
        if policy not in POLICIES:
            raise ValueError(f"unknown ROSE placement policy {policy!r}; choose one of {list(POLICIES)}")
        self.policy = policy
        self.shed_after_s = shed_after_s  # a worker over its slots this long is asked to shed (s)
        self.workers: dict[str, WorkerReport] = {}  # address -> latest report
        self.refused: dict[str, str] = {}  # address -> why it takes no rollouts
        self.left: set[str] = set()  # addresses of workers that left, until one registers again there
        self.tasks: dict[str, RolloutTask] = {}  # managed rollout tasks by key, until forgotten
        self.inflight: dict[str, dict[str, InFlight]] = collections.defaultdict(dict)  # address -> key -> task
        self.where: dict[str, str] = {}  # key of a running rollout task -> its worker
        self.shedding: dict[str, set[str]] = collections.defaultdict(set)  # address -> keys asked to shed
        self.over_since: dict[str, float] = {}  # address -> when it went over its slots (s)
        self.counts = collections.Counter()  # dispatched, shed, memory, erred, ... per worker: "dispatched@addr"
        self.events: collections.deque[LogEntry] = collections.deque(maxlen=events_len)
        self.history: collections.deque[Sample] = collections.deque(maxlen=history_len)
        self.training: set[str] = set()  # keys of train tasks running now (colocated workers yield)
        # A train task waits only for tasks outside the book (the scores of rollouts that ended): it starts in
        # moments. Set by the plugin before each dispatch; colocated workers take nothing new meanwhile.
        self.train_due = False
        self.last_busy = now  # last time a rollout waited or ran (for the elastic scaler) (s)
        self.waiting_warning: str | None = None  # why parked tasks wait with no worker to take them
        # rose: move the tail off serving workers once dedicated ones have room (`plan_migrate`). Off by
        # default: on this 2-core host it made no difference we could measure (RESULTS, elastic_e2e)
        self.migrate = migrate and policy == "rose"
        # group of a task asked to migrate (its first task's key, `group_of`) -> (dedicated worker it is meant
        # for, its width): room held there until its continuation is parked, so that one free slot does not
        # draw several tasks
        self.migrating: dict[str, tuple[str, int]] = {}

    # ---------------------------------------------------------------- workers
    def on_worker_added(self, addr: str, stimulus_id: str) -> None:
        self.left.discard(addr)  # a new worker at an address used before

    def on_report(self, addr: str, report: WorkerReport, now: float, running: Container[str],
                  stimulus_id: str) -> list[Instruction]:
        if addr in self.left:
            return []  # late report of a worker that left
        if report.role not in ROLES:
            self._refuse(addr, f"unknown role {report.role!r}; known roles: {list(ROLES)}", now, stimulus_id)
            return []
        old = self.workers.get(addr)
        self.workers[addr] = report
        out: list[Instruction] = []
        if old is None:
            self._event(now, "joined", addr, f"role {report.role}, {report.slots} slots", stimulus_id)
        if old is None or (old.slots, old.weight_version) != (report.slots, report.weight_version):
            out.append(Dispatch(stimulus_id))
        if old is not None and report.slots < old.slots:  # a drop: shed now if due
            w = self.slot(addr, running)
            if w is not None:
                out += self._check_shed(w, now, stimulus_id, view=self.view(running))
        return out

    def on_bad_report(self, addr: str, error: str, now: float, stimulus_id: str) -> None:
        """A report that could not be read (`WorkerReport.from_msg` refused it): refuse the worker."""
        if addr not in self.left:
            self._refuse(addr, f"malformed report: {error}", now, stimulus_id)

    def _refuse(self, addr: str, why: str, now: float, stimulus_id: str) -> None:
        if addr in self.refused:
            return  # said once
        self.refused[addr] = why
        logger.error("refusing worker %s for rollouts: %s", addr, why)
        self._event(now, "refused", addr, why, stimulus_id)

    def on_worker_removed(self, addr: str, now: float, stimulus_id: str) -> list[Instruction]:
        info = self.workers.pop(addr, None)
        self.refused.pop(addr, None)
        self.over_since.pop(addr, None)
        self.shedding.pop(addr, None)
        lost = self.inflight.pop(addr, {})
        self.left.add(addr)
        if info is not None:
            self._event(now, "removed", addr, f"{len(lost)} rollout tasks to re-place", stimulus_id)
        return [Dispatch(stimulus_id)]

    # ---------------------------------------------------------------- rollout tasks
    def on_parked(self, tasks: list[RolloutTask], now: float, stimulus_id: str) -> list[Instruction]:
        """Rollout tasks now wait for `dispatch` (new, retried, or back from a worker that left)."""
        for t in tasks:
            self.tasks[t.key] = t
            self.migrating.pop(group_of(t.key), None)  # a moved group's continuation is here: room freed
        if not tasks:
            return []
        self.last_busy = now
        return [Dispatch(stimulus_id)]

    def on_started(self, key: str, addr: str, now: float, stimulus_id: str) -> None:
        self.where[key] = addr
        task = self.tasks[key]
        self.inflight[addr][key] = InFlight(key, task.width, now, task.min_version)

    def on_finished(self, key: str, finish_state: str, stimulus_id: str) -> list[Instruction]:
        """A managed task left processing: `finish_state` memory, erred, or released (its worker left)."""
        return self._release(key, finish_state, stimulus_id)

    def _release(self, key: str, how: str, stimulus_id: str) -> list[Instruction]:
        """`key`'s slots are free: it finished (`how`: memory, erred, released) or yielded them."""
        addr = self.where.pop(key, None)
        if addr is not None and self.inflight.get(addr, {}).pop(key, None) is not None:
            if key in self.shedding[addr]:
                self.shedding[addr].discard(key)
                self.counts[f"shed-returned@{addr}"] += 1
            self.counts[f"{how}@{addr}"] += 1
        if how not in ("memory", "yielded"):
            self.migrating.pop(group_of(key), None)  # no continuation will come
        return [Dispatch(stimulus_id)]

    def on_yielded(self, key: str, addr: str, stimulus_id: str) -> list[Instruction]:
        """Managed task `key`, still running on `addr`, was shed there and holds no slots any more: its
        continuation is on its way to be parked (the task ends when its group is done elsewhere)."""
        if self.where.get(key) != addr:
            return []  # finished already, or a late word from a worker it no longer runs on
        return self._release(key, "yielded", stimulus_id)

    def on_forgotten(self, key: str) -> None:
        self.tasks.pop(key, None)

    # ---------------------------------------------------------------- training on colocated workers
    def on_train_started(self, key: str, now: float, running: Container[str], stimulus_id: str) -> list[Shed]:
        """Colocated workers have no slots while a train task runs; they give the device back at once."""
        self.training.add(key)
        self._event(now, "training", "", f"{key}: colocated rollout workers yield", stimulus_id)
        out: list[Shed] = []
        for addr, r in self.workers.items():
            w = self.slot(addr, running) if r.colocated else None
            if w is not None:
                out += self._check_shed(w, now, stimulus_id, force=True)
        return out

    def on_train_finished(self, key: str, stimulus_id: str) -> list[Instruction]:
        self.training.discard(key)
        return [Dispatch(stimulus_id)]

    # ---------------------------------------------------------------- decisions
    def slot(self, addr: str, running: Container[str]) -> WorkerSlot | None:
        """One running rollout worker as the policy sees it (None for others)."""
        r = self.workers.get(addr)
        if r is None or addr not in running or not r.is_rollout:
            return None
        used = sum(t.width for t in self.inflight.get(addr, {}).values())
        slots = 0 if (self.training or self.train_due) and r.colocated else int(r.slots)
        return WorkerSlot(addr, r.role, slots, used, int(r.weight_version))

    def view(self, running: Container[str]) -> list[WorkerSlot]:
        return [w for w in (self.slot(a, running) for a in self.workers) if w is not None]

    def dispatch(self, waiting_keys: list[str], now: float, running: Container[str],
                 stimulus_id: str) -> list[Assignment]:
        """Where the parked tasks `waiting_keys` (in priority order) go now; the rest keep waiting."""
        if not waiting_keys:
            return []
        self.last_busy = now
        view = self.view(running)
        assignments = place([self.tasks[k] for k in waiting_keys], view, self.policy)
        if not assignments:
            self._warn_waiting(len(waiting_keys), view, now, stimulus_id)
            return []
        self.waiting_warning = None
        for a in assignments:
            self.counts[f"dispatched@{a.worker}"] += 1
        return assignments

    def _warn_waiting(self, n: int, view: list[WorkerSlot], now: float, stimulus_id: str) -> None:
        if view:
            return  # workers exist and are full, or behind on weights: waiting is normal
        msg = (f"{n} rollout tasks wait: no rollout-capable worker is connected for policy {self.policy!r} "
               f"(start one with `dask worker ADDR --preload rose.worker --rose-role dedicated`)")
        if self.waiting_warning is None:
            logger.warning(msg)
            self._event(now, "warning", "", msg, stimulus_id)
        self.waiting_warning = msg

    def tick(self, now: float, running: Container[str], stimulus_id: str, waiting: int = 0) -> list[Shed]:
        """Periodic: sample each rollout worker into the history; shed where a worker stayed over its slots;
        with nothing `waiting` (parked tasks), move the tail off serving workers."""
        if any(self.inflight.values()):
            self.last_busy = now
        out: list[Shed] = []
        view = self.view(running)
        for w in view:
            r = self.workers[w.address]
            self.history.append(Sample(now, w.address, w.role, w.slots, w.used, r.slo_met, r.slo_requests))
            out += self._check_shed(w, now, stimulus_id, view=view)
        if self.migrate and not waiting and not out:
            out += self._check_migrate(view, now, stimulus_id)
        return out

    def on_room(self, now: float, running: Container[str], stimulus_id: str, waiting: int) -> list[Shed]:
        """Colocated workers have their slots back (a train step ended) and the parked tasks were placed:
        with tail migration on and nothing `waiting`, move the tail off serving workers now. At the next
        tick (TICK_S) a step's tail is often over: asynchronously, a step's rollouts placed on serving
        workers while the trainer trained outlast its train step by less than that."""
        if not self.migrate or waiting or self.training:
            return []
        return self._check_migrate(self.view(running), now, stimulus_id)

    # A serving worker's rollouts run in what its serving traffic leaves; a dedicated worker with room
    # runs them faster. plan_migrate picks the oldest groups on serving workers (the likeliest tail) that
    # fit the dedicated workers' free slots, less the room already held for earlier moves (and a serving
    # worker's batch, less the groups already asked to leave it).
    def _check_migrate(self, view: list[WorkerSlot], now: float, stimulus_id: str) -> list[Shed]:
        held = collections.Counter()
        for dst, width in self.migrating.values():
            held[dst] += width
        roles = {w.address: w.role for w in view}
        for addr, keys in self.shedding.items():
            if roles.get(addr) == "serving":
                tasks = self.inflight.get(addr, {})
                held[addr] -= sum(tasks[k].width for k in keys if k in tasks)
        slots = [WorkerSlot(w.address, w.role, w.slots, max(0, w.used + held[w.address]), w.weight_version)
                 for w in view]
        running = [Running(k, addr, t.width, t.placed_at) for addr, tasks in self.inflight.items()
                   if roles.get(addr) == "serving" for k, t in tasks.items() if k not in self.shedding[addr]]
        moves = plan_migrate(running, slots, 0)
        by_src: dict[str, list[str]] = collections.defaultdict(list)
        for a in moves:
            src = self.where[a.key]
            by_src[src].append(a.key)
            self.shedding[src].add(a.key)
            self.migrating[group_of(a.key)] = (a.worker, self.tasks[a.key].width)
        out = []
        for src, keys in by_src.items():
            self.counts[f"migrated@{src}"] += len(keys)
            self._event(now, "migrate", src, f"{len(keys)} tasks to dedicated workers with room", stimulus_id)
            out.append(Shed(src, tuple(keys), "migrate"))
        return out

    # Over its slots, a worker waits out shed_after_s first: a serving worker's capacity dips briefly
    # with bursts of traffic, and a shed task costs a continuation. Then it gives back only what another
    # worker has room for now (plan_shed), less what earlier sheds are still bringing there, and the
    # continuation goes where the room is (no affinity back). Forced (training), it sheds all at once.
    # Tasks already asked to shed do not count again; plan_shed picks the newest (least progress).
    def _check_shed(self, w: WorkerSlot, now: float, stimulus_id: str, force: bool = False,
                    view: list[WorkerSlot] = ()) -> list[Shed]:
        """`view`: the rollout workers as `view` gives them, for the room elsewhere (unused when forced)."""
        if w.used <= w.slots:
            self.over_since.pop(w.address, None)
            return []
        since = self.over_since.setdefault(w.address, now)
        if not force and now - since < self.shed_after_s:
            return []
        pending = self.shedding[w.address]
        others, held = None, 0
        if not force:
            roles = ROLES_OF_POLICY[self.policy]
            others = [o for o in view if o.address != w.address and o.role in roles]
            held = sum(t.width for a, keys in self.shedding.items() for k, t in self.inflight.get(a, {}).items()
                       if k in keys)
        keys = plan_shed([t for k, t in self.inflight[w.address].items() if k not in pending], w.slots, others, held)
        if not keys:
            return []
        pending.update(keys)
        self.counts[f"shed@{w.address}"] += len(keys)
        self._event(now, "shed", w.address, f"{len(keys)} tasks ({w.used} sequences on {w.slots} slots)",
                    stimulus_id)
        return [Shed(w.address, tuple(keys), "training" if force else "over-slots")]

    def _event(self, now: float, kind: str, addr: str, detail: str, stimulus_id: str) -> None:
        self.events.append(LogEntry(now, kind, addr, detail, stimulus_id))

    # ---------------------------------------------------------------- introspection
    def state(self, now: float, running: Container[str], parked: int) -> dict:
        """A plain-data snapshot (for clients, the dashboard and tests); `parked`: tasks waiting now."""
        view = {w.address: w for w in self.view(running)}
        workers = {}
        for addr, r in self.workers.items():
            w = view.get(addr)
            workers[addr] = {"role": r.role, "site": r.site, "slots": r.slots, "used": w.used if w else 0,
                             "inflight": len(self.inflight.get(addr, {})), "weight_version": r.weight_version,
                             "model": r.model, "shed": self.counts[f"shed@{addr}"],
                             "yielded": self.counts[f"yielded@{addr}"],
                             "migrated": self.counts[f"migrated@{addr}"],
                             "dispatched": self.counts[f"dispatched@{addr}"], "slo_met": r.slo_met,
                             "slo_requests": r.slo_requests, "elastic": bool(r.elastic),
                             "colocated": bool(r.colocated)}
        return {"policy": self.policy, "workers": workers, "refused": dict(self.refused), "parked": parked,
                "managed": len(self.tasks), "training": sorted(self.training), "warning": self.waiting_warning,
                "events": list(self.events)[-50:], "idle_s": now - self.last_busy}

    def elastic_demand(self, waiting_keys: list[str], now: float, running: Container[str]) -> dict:
        """What the elastic baseline's scaler needs: sequences waiting that no worker has room for."""
        free = sum(max(0, w.free) for w in self.view(running) if w.role == "dedicated")
        waiting = sum(self.tasks[k].width for k in waiting_keys)
        return {"waiting_seqs": max(0, waiting - free), "idle_s": now - self.last_busy}
