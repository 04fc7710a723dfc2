"""Scheduler side: `dask scheduler --preload rose.plugin [--rose-policy {rose,fixed,elastic}]`.

Places rollout tasks by *park and dispatch* (DESIGN.md section 6):
- In `update_graph`, rollout tasks (annotation `rose-role=rollout`, or a key starting `rose-rollout-`)
  get a worker restriction to an address that never exists, so when ready they wait in `no-worker`.
- Workers report `{role, slots, weight_version, ...}` with `Worker.log_event` on every change (the
  first report rides in `Worker.metrics`, which registration carries).
- On each report or rollout completion, a dispatch (deferred with `loop.add_callback`: never
  re-entering `transitions` from inside a hook) asks the pure policy (`rose.runtime.placement`) where
  the waiting tasks go, pins each to its one worker and transitions it to processing. A task pinned to
  one worker is never stolen.
- A worker whose slots stay below the sequences it runs, for `--rose-shed-after` seconds, is asked to
  shed the newest tasks (`plan_shed`); each returns a continuation at its next turn boundary, which the
  graph resubmits and this plugin places elsewhere.
- A dedicated worker started `--rose-colocated` shares its device with the trainer: while a train task
  (annotation `rose-trains`) is processing, it has no slots, and what it still runs is shed at once.
Dask worker resources are not used for capacity: the scheduler hands out all queued tasks at once and
`set_resources` does not wake a worker's queue.

The same settings come from dask config (`rose.policy`, `rose.shed-after`), e.g. DASK_ROSE__POLICY=fixed.
"""
from __future__ import annotations

import collections
import functools
import logging
import time

import click
import dask
from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from rose.runtime.placement import POLICIES, InFlight, RolloutTask, WorkerSlot, place, plan_shed
from rose.worker import PLACEMENT_TOPIC as TOPIC  # Worker.log_event topic of capacity reports
from rose.worker import ROLES as KNOWN_ROLES
from rose.worker import ROLLOUT_ROLES

logger = logging.getLogger("rose.plugin")

PLUGIN_NAME = "rose"
PARK = "rose://parked"  # a worker address that never exists: restricted tasks wait in no-worker
ROLLOUT_KEY_PREFIX = "rose-rollout-"
TICK_S = 0.25  # shed checks, history samples


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


class RoseScheduler(SchedulerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, policy: str = "rose", shed_after_s: float = 0.5, history_s: float = 600.0):
        if policy not in POLICIES:
            raise ValueError(f"unknown ROSE placement policy {policy!r}; choose one of {list(POLICIES)}")
        self.policy = policy
        self.shed_after_s = shed_after_s  # a worker over its slots this long is asked to shed (s)
        self.scheduler = None
        self.workers: dict[str, dict] = {}  # address -> latest report (role, slots, weight_version, ...)
        self.refused: dict[str, str] = {}  # address -> why it takes no rollouts
        self.tasks: dict[str, RolloutTask] = {}  # managed rollout tasks by key
        self.inflight: dict[str, dict[str, InFlight]] = collections.defaultdict(dict)  # address -> key -> task
        self.where: dict[str, str] = {}  # key of a running rollout task -> its worker
        self.shedding: dict[str, set[str]] = collections.defaultdict(set)  # address -> keys asked to shed
        self.over_since: dict[str, float] = {}  # address -> when it went over its slots
        self.counts = collections.Counter()  # dispatched, shed, completed, ... per worker: "dispatched@addr"
        self.events: collections.deque = collections.deque(maxlen=1000)  # (time, kind, address, detail)
        self.history: collections.deque = collections.deque(maxlen=int(history_s / TICK_S) * 8)
        self.errors = 0
        self.last_error: str | None = None
        self.waiting_warning: str | None = None
        self.last_busy = time.monotonic()  # last time a rollout waited or ran (for the elastic scaler)
        self.train_keys: set[str] = set()  # tasks annotated rose-trains, until forgotten
        self.training: set[str] = set()  # those of them processing now (colocated workers yield)
        self._kick_pending = False
        self._pc: PeriodicCallback | None = None

    # ---------------------------------------------------------------- lifecycle
    async def start(self, scheduler):
        self.scheduler = scheduler
        scheduler.handlers["rose_state"] = self._h_state
        scheduler.handlers["rose_elastic_demand"] = self._h_elastic_demand
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
    def update_graph(self, scheduler, *, tasks=(), annotations=None, **kwargs):
        annotations = annotations or {}
        roles = annotations.get("rose-role", {})
        widths = annotations.get("rose-width", {})
        versions = annotations.get("weight_version", {})
        groups = annotations.get("rose-group", {})
        affinity = annotations.get("rose-affinity", {})
        self.train_keys.update(k for k, v in annotations.get("rose-trains", {}).items() if v)
        parked = 0
        for key in tasks:
            if not (roles.get(key) == "rollout" or (isinstance(key, str) and key.startswith(ROLLOUT_KEY_PREFIX))):
                continue
            ts = scheduler.tasks.get(key)
            if ts is None or ts.state in ("memory", "erred", "processing"):
                continue
            self.tasks[key] = RolloutTask(key, int(widths.get(key, 1)), int(versions.get(key, 0)),
                                          str(groups.get(key, "")), affinity.get(key))
            ts.worker_restrictions = {PARK}
            ts.loose_restrictions = False
            parked += 1
        if parked:
            self.last_busy = time.monotonic()
            self._kick()

    # ---------------------------------------------------------------- task state
    @_guarded
    def transition(self, key, start, finish, *args, stimulus_id=None, **kwargs):
        if key in self.train_keys:
            self._train_transition(key, start, finish)
            return
        if key not in self.tasks:
            return
        if start == "processing":  # finished, erred, or its worker left
            addr = self.where.pop(key, None)
            if addr is not None and self.inflight.get(addr, {}).pop(key, None) is not None:
                if key in self.shedding[addr]:
                    self.shedding[addr].discard(key)
                    self.counts[f"shed-returned@{addr}"] += 1
                self.counts[f"{finish}@{addr}"] += 1
            self._kick()
        if finish == "processing":
            addr = self.scheduler.tasks[key].processing_on.address
            self.where[key] = addr
            self.inflight[addr][key] = InFlight(key, self.tasks[key].width, time.monotonic())
        elif finish in ("waiting", "released", "no-worker"):
            ts = self.scheduler.tasks.get(key)
            if ts is not None:  # retried or its worker died: wait for the policy again
                ts.worker_restrictions = {PARK}
                ts.loose_restrictions = False
        elif finish == "forgotten":
            self.tasks.pop(key, None)

    def _train_transition(self, key: str, start: str, finish: str) -> None:
        if finish == "processing":
            self.training.add(key)
            self._event("training", "", f"{key}: colocated rollout workers yield")
            now = time.monotonic()
            for addr, r in self.workers.items():  # give the device back to the trainer now
                w = self.slot(addr) if r.get("colocated") else None
                if w is not None:
                    self._check_shed(w, now, force=True)
        elif start == "processing":
            self.training.discard(key)
            self._kick()
        if finish == "forgotten":
            self.train_keys.discard(key)

    # ---------------------------------------------------------------- workers
    @_guarded
    def add_worker(self, scheduler, worker):
        ws = scheduler.workers.get(worker)
        report = (ws.metrics or {}).get("rose") if ws is not None else None
        if report:
            self._report(worker, report)

    @_guarded
    def remove_worker(self, scheduler, worker, *, stimulus_id=None, **kwargs):
        info = self.workers.pop(worker, None)
        self.refused.pop(worker, None)
        self.over_since.pop(worker, None)
        self.shedding.pop(worker, None)
        lost = self.inflight.pop(worker, {})
        if info is not None:
            self._event("removed", worker, f"{len(lost)} rollout tasks to re-place")
        self._kick()

    @_guarded
    def log_event(self, topic, msg):
        if topic == TOPIC and isinstance(msg, dict) and "worker" in msg:
            self._report(msg["worker"], msg)

    def _report(self, addr: str, report: dict) -> None:
        if self.scheduler is None or addr not in self.scheduler.workers:
            return  # late report of a worker that left
        role = report.get("role")
        if role not in KNOWN_ROLES:
            if addr not in self.refused:
                self.refused[addr] = f"unknown role {role!r}; known roles: {list(KNOWN_ROLES)}"
                logger.error("refusing worker %s for rollouts: it announced %s", addr, self.refused[addr])
                self._event("refused", addr, self.refused[addr])
            return
        old = self.workers.get(addr)
        self.workers[addr] = dict(report, reported_at=time.time())
        if old is None:
            self._event("joined", addr, f"role {role}, {report.get('slots', 0)} slots")
        if old is None or old.get("slots") != report.get("slots") or \
                old.get("weight_version") != report.get("weight_version"):
            self._kick()
        if old is not None and report.get("slots", 0) < old.get("slots", 0):  # a drop: shed now if due
            w = self.slot(addr)
            if w is not None:
                self._check_shed(w, time.monotonic())

    # ---------------------------------------------------------------- dispatch
    def _kick(self) -> None:
        if not self._kick_pending and self.scheduler is not None:
            self._kick_pending = True
            self.scheduler.loop.add_callback(self._dispatch)

    def slot(self, addr: str) -> WorkerSlot | None:
        """One running rollout worker as the policy sees it (None for others)."""
        s, r = self.scheduler, self.workers.get(addr)
        ws = s.workers.get(addr)
        if r is None or ws is None or ws not in s.running or r.get("role") not in ROLLOUT_ROLES:
            return None
        used = sum(t.width for t in self.inflight.get(addr, {}).values())
        slots = 0 if self.training and r.get("colocated") else int(r.get("slots", 0))
        return WorkerSlot(addr, r["role"], slots, used, int(r.get("weight_version", -1)))

    def view(self) -> list[WorkerSlot]:
        return [w for w in map(self.slot, self.workers) if w is not None]

    def parked(self) -> list:
        return sorted((ts for ts in self.scheduler.unrunnable if ts.key in self.tasks), key=lambda ts: ts.priority)

    @_guarded
    def _dispatch(self) -> None:
        self._kick_pending = False
        waiting = self.parked()
        if not waiting:
            return
        self.last_busy = time.monotonic()
        view = self.view()
        assignments = place([self.tasks[ts.key] for ts in waiting], view, self.policy)
        if not assignments:
            self._warn_waiting(len(waiting), view)
            return
        self.waiting_warning = None
        recs = {}
        for a in assignments:
            ts = self.scheduler.tasks[a.key]
            ts.worker_restrictions = {a.worker}
            recs[a.key] = "processing"
            self.counts[f"dispatched@{a.worker}"] += 1
        self.scheduler.transitions(recs, stimulus_id=f"rose-dispatch-{time.time()}")

    def _warn_waiting(self, n: int, view: list[WorkerSlot]) -> None:
        if view:
            return  # workers exist and are full, or behind on weights: waiting is normal
        msg = (f"{n} rollout tasks wait: no rollout-capable worker is connected for policy {self.policy!r} "
               f"(start one with `dask worker ADDR --preload rose.worker --rose-role dedicated`)")
        if self.waiting_warning is None:
            logger.warning(msg)
            self._event("warning", "", msg)
        self.waiting_warning = msg

    # ---------------------------------------------------------------- shedding, history
    @_guarded
    def _tick(self) -> None:
        now = time.monotonic()
        if any(self.inflight.values()):
            self.last_busy = now
        for w in self.view():
            report = self.workers[w.address]
            self.history.append((time.time(), w.address, w.role, w.slots, w.used, report.get("slo_met"),
                                 report.get("slo_requests")))
            self._check_shed(w, now)

    def _check_shed(self, w: WorkerSlot, now: float, force: bool = False) -> None:
        """Ask a worker that has stayed over its slots for `shed_after_s` (or at once, `force`) to give the
        newest tasks back."""
        if w.used <= w.slots:
            self.over_since.pop(w.address, None)
            return
        since = self.over_since.setdefault(w.address, now)
        if not force and now - since < self.shed_after_s:
            return
        pending = self.shedding[w.address]
        running = [t for k, t in self.inflight[w.address].items() if k not in pending]
        keys = plan_shed(running, w.slots)
        if keys:
            pending.update(keys)
            self.counts[f"shed@{w.address}"] += len(keys)
            self._event("shed", w.address, f"{len(keys)} tasks ({w.used} sequences on {w.slots} slots)")
            self.scheduler.worker_send(w.address, {"op": "rose-shed", "keys": keys})

    def _event(self, kind: str, addr: str, detail: str) -> None:
        self.events.append((time.time(), kind, addr, detail))

    # ---------------------------------------------------------------- introspection
    def state(self) -> dict:
        """A plain-data snapshot (for clients, the dashboard and tests)."""
        view = {w.address: w for w in self.view()}
        workers = {}
        for addr, r in self.workers.items():
            w = view.get(addr)
            workers[addr] = {"role": r.get("role"), "site": r.get("site"), "slots": r.get("slots", 0),
                             "used": w.used if w else 0, "inflight": len(self.inflight.get(addr, {})),
                             "weight_version": r.get("weight_version", -1), "model": r.get("model"),
                             "shed": self.counts[f"shed@{addr}"], "dispatched": self.counts[f"dispatched@{addr}"],
                             "slo_met": r.get("slo_met"), "slo_requests": r.get("slo_requests"),
                             "elastic": bool(r.get("elastic")), "colocated": bool(r.get("colocated"))}
        return {"policy": self.policy, "workers": workers, "refused": dict(self.refused),
                "parked": len(self.parked()) if self.scheduler is not None else 0,
                "managed": len(self.tasks), "training": sorted(self.training),
                "errors": self.errors, "last_error": self.last_error,
                "warning": self.waiting_warning, "events": list(self.events)[-50:],
                "idle_s": time.monotonic() - self.last_busy}

    def _h_state(self) -> dict:
        return self.state()

    def _h_elastic_demand(self) -> dict:
        """What the elastic baseline's scaler needs: sequences waiting that no worker has room for."""
        free = sum(max(0, w.free) for w in self.view() if w.role == "dedicated")
        waiting = sum(self.tasks[ts.key].width for ts in self.parked())
        return {"waiting_seqs": max(0, waiting - free), "idle_s": time.monotonic() - self.last_busy}


def _register_dashboard() -> None:
    from rose.dashboard import register

    register()


# The dashboard page must be in Dask's table of pages before the scheduler starts its dashboard; a
# scheduler imports its preloads first, so this runs in time.
_register_dashboard()


def get_plugin(scheduler) -> RoseScheduler | None:
    return scheduler.plugins.get(PLUGIN_NAME)


@click.command()
@click.option("--rose-policy", type=click.Choice(POLICIES), default=None,
              help="rollout placement: rose (dedicated, then serving spare capacity), fixed (dedicated only), "
                   "elastic (dedicated, plus on-demand workers)  [default: dask config rose.policy, else rose]")
@click.option("--rose-shed-after", type=click.FloatRange(min=0), default=None,
              help="seconds a worker may stay over its slots before it is asked to shed rollouts [default: 0.5]")
def dask_setup(scheduler, rose_policy, rose_shed_after):
    policy = rose_policy or dask.config.get("rose.policy", "rose")
    if policy not in POLICIES:
        raise click.BadParameter(f"rose.policy={policy!r}; choose one of {list(POLICIES)}", param_hint="rose.policy")
    shed_after = rose_shed_after if rose_shed_after is not None else float(dask.config.get("rose.shed-after", 0.5))
    scheduler.add_plugin(RoseScheduler(policy=policy, shed_after_s=shed_after))
