"""The placement plugin's Dask side: `RoseScheduler` turns scheduler hooks into `PlacementBook` events
and acts on the records the book returns.

Park and dispatch:
- In `update_graph`, rollout tasks (`rose.runtime.protocol.is_rollout_task`) get a worker restriction
  to an address that never exists (`PARK`), so when ready they wait in `no-worker`.
- Workers report a `WorkerReport` with `Worker.log_event` on every change (the first rides in
  `Worker.metrics`, which registration carries); it is read here, once, with `WorkerReport.from_msg`.
- On each report or rollout completion the book asks for a dispatch; it runs deferred with
  `loop.add_callback` (never re-entering `transitions` from inside a hook), pins each assigned task to
  its one worker and transitions it to processing. A task pinned to one worker is never stolen.
- The book's `Shed` records go to their worker as a `rose-shed` message; each shed task stops at its
  next turn boundary, says so (`rose-yielded`: its slots are free) and resubmits its continuation,
  which the book places elsewhere; the task itself ends when its group is done.
Dask worker resources are not used for capacity: the scheduler hands out all queued tasks at once and
`set_resources` does not wake a worker's queue.
"""
from __future__ import annotations

import functools
import logging
import time

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from rose.runtime.placement import RolloutTask
from rose.runtime.protocol import PLUGIN_NAME, TOPIC, YIELDED_OP, Annotation, WorkerReport, is_rollout_task
from rose.runtime.scheduler.barrier import DONE, KeyBarrier
from rose.runtime.scheduler.book import Dispatch, Instruction, PlacementBook, Shed
from rose.runtime.scheduler.running import RunningWorkers

logger = logging.getLogger("rose.scheduler")

PARK = "rose://parked"  # a worker address that never exists: restricted tasks wait in no-worker
TICK_S = 0.25  # shed checks, history samples (s)


def _guarded(fn):
    """Hooks run inside the scheduler: an exception is logged at ERROR and counted, never lost, and
    never propagates into Dask's own transition machinery."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except Exception as e:
            self.errors += 1
            self.last_error = f"{fn.__name__}: {type(e).__name__}: {e}"
            logger.exception("rose plugin hook %s failed (%d errors so far)", fn.__name__, self.errors)

    return wrapper


def _park(ts) -> None:
    ts.worker_restrictions = {PARK}
    ts.loose_restrictions = False


class RoseScheduler(SchedulerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, policy: str = "rose", shed_after_s: float = 0.5, history_s: float = 600.0,
                 migrate: bool = False):
        # history: about 8 rollout workers' samples a tick, for history_s seconds
        self.book = PlacementBook(policy, shed_after_s, time.monotonic(), history_len=int(history_s / TICK_S) * 8,
                                  migrate=migrate)
        self.scheduler = None
        self.train_keys: set[str] = set()  # tasks annotated Annotation.TRAINS, until forgotten
        self.barrier = KeyBarrier()  # callers of `rose_keys_done`: an asynchronous step's sync before its commit
        self.errors = 0  # hook failures so far
        self.last_error: str | None = None
        self._kick_pending = False
        self._pc: PeriodicCallback | None = None

    @property
    def policy(self) -> str:
        return self.book.policy

    # ---------------------------------------------------------------- lifecycle
    async def start(self, scheduler):
        self.scheduler = scheduler
        scheduler.handlers["rose_state"] = self._h_state
        scheduler.handlers["rose_elastic_demand"] = self._h_elastic_demand
        scheduler.handlers["rose_keys_done"] = self._h_keys_done
        scheduler.stream_handlers[YIELDED_OP] = self._h_yielded
        self._pc = PeriodicCallback(self._tick, TICK_S * 1000)
        self._pc.start()
        for addr in list(scheduler.workers):  # a plugin added to a running scheduler
            self.add_worker(scheduler, addr)
        logger.info("rose placement plugin started: policy=%s", self.policy)

    async def close(self):
        if self._pc is not None:
            self._pc.stop()

    # ---------------------------------------------------------------- graph intake
    @_guarded
    def update_graph(self, scheduler, *, tasks=(), annotations=None, stimulus_id=None, **kwargs):
        annotations = annotations or {}
        self.train_keys.update(k for k, v in annotations.get(Annotation.TRAINS, {}).items() if v)
        parked = []
        for key in tasks:
            mine = {name: by_key[key] for name, by_key in annotations.items() if key in by_key}
            # A later graph names tasks it depends on among its own, without their annotations: a task the
            # book already holds keeps its record (re-parked from such a mention it would take one slot, at
            # weight version 0, where it runs a whole group at the version its step needs).
            if key in self.book.tasks or not is_rollout_task(key, mine):
                continue
            ts = scheduler.tasks.get(key)
            if ts is None or ts.state in ("memory", "erred", "processing"):
                continue
            parked.append(RolloutTask(key, int(mine.get(Annotation.WIDTH, 1)), int(mine.get(Annotation.VERSION, 0)),
                                      str(mine.get(Annotation.GROUP, "")), mine.get(Annotation.AFFINITY)))
            _park(ts)
        self._apply(self.book.on_parked(parked, time.monotonic(), stimulus_id or f"rose-update-graph-{time.time()}"))

    # ---------------------------------------------------------------- task state
    @_guarded
    def transition(self, key, start, finish, *args, stimulus_id=None, **kwargs):
        if key not in self.train_keys and key not in self.book.tasks:
            if self.barrier.waits and finish in DONE:  # a task someone waits on, outside the book
                self._recheck()
            return  # the hot path: most transitions are of tasks this plugin does not manage
        self._transition(key, start, finish, stimulus_id)
        if self.barrier.waits:
            self._recheck()

    def _transition(self, key, start, finish, stimulus_id) -> None:
        sid = stimulus_id or f"rose-transition-{time.time()}"
        if key in self.train_keys:
            if finish == "processing":
                self._apply(self.book.on_train_started(key, time.monotonic(), self.running(), sid))
            elif start == "processing":
                self._apply(self.book.on_train_finished(key, sid))
                if self.book.migrate:  # after the dispatch the line above asked for
                    self.scheduler.loop.add_callback(self._migrate)
            if finish == "forgotten":
                self.train_keys.discard(key)
            return
        if start == "processing":  # finished, erred, or its worker left
            self._apply(self.book.on_finished(key, finish, sid))
        if finish == "processing":
            self.book.on_started(key, self.scheduler.tasks[key].processing_on.address, time.monotonic(), sid)
        elif finish in ("waiting", "released", "no-worker"):
            ts = self.scheduler.tasks.get(key)
            if ts is not None:  # retried or its worker died: wait for the policy again
                _park(ts)
        elif finish == "forgotten":
            self.book.on_forgotten(key)

    # ---------------------------------------------------------------- workers
    @_guarded
    def add_worker(self, scheduler, worker):
        sid = f"rose-add-worker-{time.time()}"
        self.book.on_worker_added(worker, sid)
        ws = scheduler.workers.get(worker)
        msg = (ws.metrics or {}).get("rose") if ws is not None else None
        if msg:
            self._report(worker, msg, sid)

    @_guarded
    def remove_worker(self, scheduler, worker, *, stimulus_id=None, **kwargs):
        sid = stimulus_id or f"rose-remove-worker-{time.time()}"
        self._apply(self.book.on_worker_removed(worker, time.monotonic(), sid))

    @_guarded
    def log_event(self, topic, msg):
        if topic == TOPIC and isinstance(msg, dict) and "worker" in msg:
            self._report(msg["worker"], msg, f"rose-report-{time.time()}")

    def _report(self, addr: str, msg: dict, stimulus_id: str) -> None:
        if self.scheduler is None or addr not in self.scheduler.workers:
            return  # late report of a worker that left, or one that names no worker of this scheduler
        now = time.monotonic()
        try:
            report = WorkerReport.from_msg(msg)
        except ValueError as e:
            self.book.on_bad_report(addr, str(e), now, stimulus_id)
            return
        self._apply(self.book.on_report(addr, report, now, self.running(), stimulus_id))

    @_guarded
    def _h_yielded(self, key=None, worker=None, **kwargs) -> None:
        """A worker's shed rollout task holds no slots any more (it waits for its group to finish elsewhere)."""
        self._apply(self.book.on_yielded(key, worker, f"rose-yielded-{time.time()}"))
        if self.barrier.waits:
            self._recheck()

    def _recheck(self) -> None:
        """Wake the callers of `rose_keys_done` (receivers waiting to commit a version) that are clear."""
        self.barrier.recheck(self.scheduler.tasks, self.book.inflight)

    def running(self) -> RunningWorkers:
        """The workers Dask counts as running (not paused, not closing), as the book asks: by address."""
        return RunningWorkers(self.scheduler)

    # ---------------------------------------------------------------- acting on the book's records
    def _apply(self, instructions: list[Instruction]) -> None:
        for i in instructions:
            if isinstance(i, Dispatch):
                self._kick()
            elif isinstance(i, Shed):
                # Only a colocated worker yielding to training keeps its continuations' affinity (its
                # prefixes are cached there for after the train step); the others go where there is room.
                self.scheduler.worker_send(i.worker, {"op": "rose-shed", "keys": list(i.keys),
                                                      "migrate": i.reason != "training"})

    def _kick(self) -> None:
        if not self._kick_pending and self.scheduler is not None:
            self._kick_pending = True
            self.scheduler.loop.add_callback(self._dispatch)

    def parked(self) -> list[str]:
        """Keys of the managed tasks waiting in no-worker, in Dask's priority order."""
        waiting = (ts for ts in self.scheduler.unrunnable if ts.key in self.book.tasks)
        return [ts.key for ts in sorted(waiting, key=lambda ts: ts.priority)]

    def _train_due(self) -> bool:
        """Whether a train task waits only for tasks this plugin does not place (the scores of rollouts that
        have ended): it starts in moments, and what a colocated worker took now it would shed then."""
        for key in self.train_keys:
            ts = self.scheduler.tasks.get(key)
            if ts is not None and ts.state in ("waiting", "queued", "no-worker") and not self._waits_on_rollouts(ts):
                return True
        return False

    def _waits_on_rollouts(self, ts) -> bool:
        """Whether a managed rollout task is among what `ts` still waits for, however deep (a graph may
        chain reward nodes between its rollouts and its train node)."""
        stack, seen = list(ts.waiting_on or ()), set()
        while stack:
            dep = stack.pop()
            if dep.key in seen:
                continue
            seen.add(dep.key)
            if dep.key in self.book.tasks and dep.state != "memory":
                return True
            stack.extend(dep.waiting_on or ())
        return False

    @_guarded
    def _dispatch(self) -> None:
        self._kick_pending = False
        now = time.monotonic()
        sid = f"rose-dispatch-{now}"
        self.book.train_due = self._train_due()
        assignments = self.book.dispatch(self.parked(), now, self.running(), sid)
        if not assignments:
            return
        for a in assignments:
            self.scheduler.tasks[a.key].worker_restrictions = {a.worker}
        self.scheduler.transitions({a.key: "processing" for a in assignments}, stimulus_id=sid)

    def _parked_count(self) -> int:
        """How many managed tasks wait (counted, not sorted, as `parked` does): tail migration's input."""
        return sum(ts.key in self.book.tasks for ts in self.scheduler.unrunnable)

    @_guarded
    def _migrate(self) -> None:
        now = time.monotonic()
        self._apply(self.book.on_room(now, self.running(), f"rose-room-{now}", self._parked_count()))

    @_guarded
    def _tick(self) -> None:
        now = time.monotonic()
        self.book.train_due = self._train_due()
        # what waits matters only to tail migration: counted only when the book migrates
        waiting = self._parked_count() if self.book.migrate else 0
        self._apply(self.book.tick(now, self.running(), f"rose-tick-{now}", waiting=waiting))

    # ---------------------------------------------------------------- introspection
    def state(self) -> dict:
        """A plain-data snapshot (for clients, the dashboard and tests)."""
        started = self.scheduler is not None
        running, parked = (self.running(), len(self.parked())) if started else (set(), 0)
        st = self.book.state(time.monotonic(), running, parked)
        return dict(st, errors=self.errors, last_error=self.last_error,
                    barrier={"calls": self.barrier.calls, "waited": self.barrier.waited, "waits": self.barrier.waits})

    def _h_state(self) -> dict:
        return self.state()

    async def _h_keys_done(self, keys=(), worker: str | None = None) -> dict:
        """Reply once every task of `keys` has ended (in memory, erred or forgotten), or, given a `worker`,
        once that worker is clear of the rollout groups they start (`barrier.clear_of`): barrier.py."""
        return {"waited_for": await self.barrier.wait(self.scheduler.tasks, keys, worker, self.book.inflight)}

    def _h_elastic_demand(self) -> dict:
        return self.book.elastic_demand(self.parked(), time.monotonic(), self.running())


def get_plugin(scheduler) -> RoseScheduler | None:
    return scheduler.plugins.get(PLUGIN_NAME)
