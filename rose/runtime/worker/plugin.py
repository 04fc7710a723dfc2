"""`RoseWorker`: the Dask worker plugin the preload `rose.worker` installs, and the tasks that reach it.

The plugin holds a worker's long-lived state, built once per worker: the host of its role (engine or
trainer, `host.py`), the weight-transfer endpoint, and the worker's side of the placement protocol:
`WorkerReport`s to the scheduler's placement plugin, and that plugin's requests to shed rollout tasks.
Tasks reach it with `rose_worker()` and stay ordinary Dask tasks.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin

from rose.errors import ConfigError
from rose.runtime.coserve.host import ServingConfig, ServingHost
from rose.runtime.protocol import (DEFAULT_SITE, PLUGIN_NAME, ROLES, TOPIC, YIELDED_OP, ModelSpec, WorkerReport,
                                   is_rollout_task)
from rose.runtime.weights.endpoint import WeightEndpoint
from rose.runtime.worker.host import Host
from rose.runtime.worker.process import tune_process
from rose.runtime.worker.rollout import RolloutHost
from rose.runtime.worker.trainer import TrainerHost

logger = logging.getLogger("rose.worker")

REPORT_CHECK_MS = 100  # how often the worker looks for a change worth reporting (slots, version, model)
REPORT_REFRESH_S = 2.0  # an unchanged report goes out again after this long (the placement keeps a history)


class RoseWorker(WorkerPlugin):
    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, role: str, cores: tuple[int, ...] | None = None, site: str = DEFAULT_SITE,
                 elastic: bool = False, max_slots: int | None = None, colocated: bool = False,
                 serving: ServingConfig | None = None, reward_model: str | None = None):
        if role not in ROLES:
            raise ConfigError(f"unknown ROSE worker role {role!r}; choose one of {list(ROLES)}")
        if not site:
            raise ConfigError("--rose-site must not be empty")
        if colocated and role != "dedicated":
            raise ConfigError(f"--rose-colocated is for dedicated rollout workers, not role {role!r}")
        if role == "serving" and serving is None:
            raise ConfigError("a worker of role 'serving' needs its serving model (--rose-serving-model DIR)")
        if (role == "reward") != (reward_model is not None):
            raise ConfigError("a worker of role 'reward' needs its model (--rose-reward-model DIR), and only it "
                              "takes one")
        self.role = role
        self.cores = cores  # CPU cores this worker's compute is bound to (None: leave as is)
        self.site = site  # network site: workers that share a fast network (weight sync topology)
        self.elastic = elastic  # started on demand by the elastic baseline's scaler (shown on the dashboard)
        # Shares its device with the trainer: the placement plugin gives it no rollouts while a train step runs.
        self.colocated = colocated
        self.max_slots = max_slots  # dedicated role: rollout sequences at once (None: twice the engine's max_num_seqs)
        self.serving = serving  # serving role: the model it serves online, its HTTP endpoint and SLO
        self.reward_model = reward_model  # reward role: the sequence-classification model it scores with
        self.slot_cap: int | None = None  # an operator's limit on the slots reported (0 drains the worker)
        self.address: str | None = None
        self.worker = None
        self.weights: WeightEndpoint | None = None  # made in setup
        self.host: Host | None = None  # made in setup, after the endpoint it prepares
        self._lock = threading.Lock()  # one prepare at a time
        # Rollout tasks running here (key -> trajectories) and the keys the scheduler asked to shed.
        self.rollouts: dict[str, int] = {}
        # Rollout tasks Dask has started here that have not handed their group to the engine yet
        # (`rollout_handed`): the engine's first iteration of a round waits for them (engine/loop.py).
        self.starting: set[str] = set()
        self.shed: set[str] = set()
        self.migrating: set[str] = set()  # of `shed`, the keys shed to move to a dedicated worker
        self._last_sent: tuple | None = None
        self._last_sent_t = 0.0
        self._report_pc = None
        self._unusable_seen = False  # the host's rollout engine was found unusable (`_check_unusable`)
        self._restart: asyncio.Future | None = None  # this worker closing to be restarted, once it is

    async def setup(self, worker):
        from tornado.ioloop import PeriodicCallback

        self.worker, self.address = worker, worker.address
        tune_process(worker, self.cores)
        self.weights = WeightEndpoint(worker, self.site, on_committed=lambda: self.send_report(force=True))
        self.host = self._new_host()  # it prepares the endpoint for each run
        # Synced versions go to the host's rollout engine (never to a serving model).
        self.weights.on_commit = self.host.load_weights
        self.weights.unusable = lambda: self.host.unusable
        await self.host.start()
        # The first report rides in Worker.metrics: a preload runs before the worker connects. Later
        # ones go with Worker.log_event on every change (capacity, weight version), checked every 100 ms.
        worker.metrics[PLUGIN_NAME] = lambda w: self._metric()
        worker.stream_handlers["rose-shed"] = self._on_shed
        self._report_pc = PeriodicCallback(self._check, REPORT_CHECK_MS)
        self._report_pc.start()
        logger.info("rose worker %s role=%s cores=%s", worker.address, self.role, self.cores)

    def _new_host(self) -> Host:
        if self.role == "trainer":
            return TrainerHost(self.address, self.weights, self.cores)
        if self.role == "dedicated":
            return RolloutHost(self.address, self.weights, self.cores, self.max_slots,
                               arriving=lambda: len(self.starting))
        if self.role == "reward":
            from rose.runtime.worker.reward_host import RewardHost

            return RewardHost(self.address, self.weights, self.reward_model, self.cores)
        return ServingHost(self.address, self.weights, self.serving, self.cores)

    def teardown(self, worker):
        if self._report_pc is not None:
            self._report_pc.stop()
        if self.host is not None:
            self.host.close()

    # ---------------------------------------------------------------- placement protocol
    @property
    def slots(self) -> int:
        """Rollout sequences this worker can run at once now (its host's), within the operator's cap."""
        n = self.host.slots if self.host is not None else 0
        return n if self.slot_cap is None else min(n, self.slot_cap)

    def set_slot_cap(self, cap: int | None) -> None:
        """Limit the rollout slots this worker offers (None: no limit; 0 drains it: its running rollouts
        are shed and finish elsewhere). Reported at once."""
        if cap is not None and cap < 0:
            raise ConfigError(f"slot cap of worker {self.address} must be >= 0 or None, got {cap}")
        self.slot_cap = cap
        self.send_report(force=True)

    def report(self) -> WorkerReport:
        return WorkerReport(worker=self.address, role=self.role, site=self.site, slots=self.slots,
                            elastic=self.elastic, colocated=self.colocated,
                            **(self.host.report() if self.host is not None else {}))

    def _metric(self) -> dict:
        """The report for the heartbeat. Never raises: Dask drops a metric that raises, without a word,
        and a worker whose heartbeat lacks its report has no role for the driver (a trainer would look
        gone). A host caught mid-change still reports who it is."""
        try:
            return self.report().to_msg()
        except Exception:
            logger.exception("worker %s could not build its report; sending its role only", self.address)
            return WorkerReport(worker=self.address, role=self.role, site=self.site).to_msg()

    def send_report(self, force: bool = False) -> None:
        """Tell the scheduler's placement plugin about a change (or every 2 s, for its history)."""
        r = self.report()
        sig = (r.slots, r.weight_version, r.model)
        now = time.monotonic()
        if force or sig != self._last_sent or now - self._last_sent_t > REPORT_REFRESH_S:
            self._last_sent, self._last_sent_t = sig, now
            self.worker.log_event(TOPIC, r.to_msg())

    def _check(self) -> None:
        self._check_unusable()
        self.send_report()

    def _check_unusable(self) -> None:
        """Once the host's rollout engine is unusable (a weight load into it raised part way), a dedicated
        worker restarts: it hands its task results to other workers, closes, and its nanny starts a new
        process, which joins the run like any new worker (a new engine, a catch-up sync; a worker without
        a nanny just leaves). A serving worker goes on serving and offers no rollout slots; syncs leave it
        out until it is restarted (restarting it here would cut its online traffic)."""
        why = self.host.unusable if self.host is not None else None
        if why is None or self._unusable_seen:
            return
        self._unusable_seen = True
        if self.role == "dedicated":
            logger.error("worker %s restarts: %s", self.address, why)
            self._restart = asyncio.ensure_future(self.worker.close_gracefully(restart=True, reason=f"rose: {why}"))
        else:
            logger.error("worker %s: %s; it goes on serving, and syncs leave it out until it is restarted",
                         self.address, why)

    def _on_shed(self, keys=(), migrate=False, **kwargs) -> None:
        """Scheduler: give these rollout tasks back at their next turn boundary (a task that has not
        started yet gives itself back at its first). `migrate`: they move to a worker with room (not
        a colocated worker's yield to training), so their continuations keep no affinity to this one."""
        self.shed.update(keys)
        if migrate:
            self.migrating.update(keys)
        logger.info("worker %s sheds %d rollout tasks (%d of them running here)", self.address, len(keys),
                    sum(k in self.rollouts for k in keys))

    def should_shed(self, key: str | None) -> bool:
        return key is not None and key in self.shed

    def affinity(self, key: str | None) -> str | None:
        """The worker a shed task's continuation should prefer: this one (its prefixes are cached here),
        unless the task was shed to move elsewhere."""
        return None if key is not None and key in self.migrating else self.address

    def yield_slots(self, key: str | None) -> None:
        """Tell the scheduler's placement plugin that rollout task `key`, still running here, holds no
        slots any more: it was shed and waits for its group to finish elsewhere. Fire and forget (on the
        worker's event loop); lost only with the connection, when the scheduler drops the worker anyway."""
        if key is not None:
            self.worker.batched_send({"op": YIELDED_OP, "key": key})

    def transition(self, key, start: str, finish: str, **kwargs) -> None:
        """Dask: task `key` went from state `start` to `finish` on this worker (its event loop)."""
        if finish == "executing":
            ts = self.worker.state.tasks.get(key)
            if ts is not None and is_rollout_task(key, ts.annotations or {}):
                self.starting.add(key)
        elif start == "executing":
            self.starting.discard(key)

    def rollout_handed(self, key: str | None) -> None:
        """Rollout task `key` has handed its group to the engine's loop. Counted off only then: an idle engine
        that found none left before the hand-off had reached it would step without that group."""
        self.starting.discard(key)

    def rollout_started(self, key: str | None, width: int) -> None:
        if key is not None:
            self.rollouts[key] = width
            self.host.in_flight = sum(self.rollouts.values())

    def rollout_ended(self, key: str | None) -> None:
        if key is not None:
            self.rollouts.pop(key, None)
            self.shed.discard(key)
            self.migrating.discard(key)
            self.host.in_flight = sum(self.rollouts.values())

    # ---------------------------------------------------------------- built once per run
    def prepare(self, spec: ModelSpec) -> WorkerReport:
        """Get ready for a run of `spec`: weights version 0, straight from the model directory (see the
        host's `prepare`). Reported at once."""
        with self._lock:
            self.host.prepare(spec)
        self.send_report(force=True)
        return self.report()


def rose_worker_of(worker) -> RoseWorker | None:
    return worker.plugins.get(PLUGIN_NAME)


def rose_worker() -> RoseWorker:
    """The ROSE plugin of the worker running the current task."""
    worker = get_worker()
    try:
        return worker.plugins[PLUGIN_NAME]
    except KeyError:
        raise RuntimeError(f"worker {worker.address} was not started with --preload rose.worker") from None


def prepare_worker(spec: ModelSpec) -> dict:
    """Task: build the current worker's engine or trainer for a run of `spec`; returns its report, as a
    plain dict with its "address"."""
    plugin = rose_worker()
    return {"address": plugin.address, **plugin.prepare(spec).to_msg()}
