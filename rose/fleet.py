"""The run's rollout workers, as the driver tracks them between and during steps.

A worker is *ready* when it holds the run's model at the weight version of the step being run. Workers
come and go during a run (an elastic scaler adds some, a by-hand `dask worker` joins, one dies): a
worker that connects mid-run is *joining* while it builds its engine (`prepare_worker`) and is brought
to the current version by a catch-up sync from the trainer; until then the placement plugin keeps
rollouts off it (its engine is behind the tasks' weight version). A worker whose preparation fails is
tried again, a few times, spaced out. A worker that left is dropped, with the scheduler's cause; Dask
re-runs its unfinished tasks and the plugin places them elsewhere. With no rollout worker left, the
run waits for one (`wait_for_worker`). If the trainer leaves, every poll raises `TrainerLost`: the
runner then restores a new trainer from the run's last checkpoint (`rose.runner`).
"""
from __future__ import annotations

import collections
import logging
import time

from distributed import Client

from rose.errors import RunError
from rose.runtime.protocol import PLUGIN_NAME, WorkerReport, rollout_addresses
from rose.runtime.worker.plugin import prepare_worker

logger = logging.getLogger("rose.run")


def scheduler_workers(client: Client) -> dict[str, dict]:
    """The scheduler's info on every connected worker, asked now.

    Not `Client.scheduler_info()`: it refreshes a cache that the client's own periodic update
    overwrites with a worker-less summary every 2 s, and reads it back after the refresh, so now and
    then it returns no workers at all (measured: 42 of 2,000 reads with the update every 5 ms). A run
    polling it every half second took that for every worker leaving: "no rollout worker is left"."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def roles_of(client: Client, workers: dict | None = None) -> dict[str, list[str]]:
    """Worker addresses by ROSE role, from the reports workers attach to their heartbeats (`workers`:
    the scheduler's worker info, if the caller has it already)."""
    if workers is None:
        workers = scheduler_workers(client)
    by_role: dict[str, list[str]] = collections.defaultdict(list)
    for addr, info in workers.items():
        msg = (info.get("metrics") or {}).get(PLUGIN_NAME)
        try:
            by_role[WorkerReport.from_msg(msg).role].append(addr)
        except ValueError:  # not a ROSE worker
            continue
    return {k: sorted(v) for k, v in by_role.items()}


class TrainerLost(RunError):
    """A worker of the run's trainer left (the trainer, or a rank of a sharded one: `context["worker"]`);
    the runner restores the trainer from the last checkpoint on the trainer workers still there."""


def wait_for_trainer(client: Client, timeout_s: float, poll_s: float = 1.0, gone: str | None = None) -> str:
    """The address of a trainer worker (not `gone`), waiting up to `timeout_s` for one to connect (a nanny
    restarting the one that died, or a new `dask worker ... --rose-role trainer`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        workers = scheduler_workers(client)
        trainers = [a for a in roles_of(client, workers).get("trainer", []) if a != gone]
        if trainers:
            return trainers[0]
        if time.monotonic() >= deadline:
            raise RunError(f"no trainer worker connected in {timeout_s:.0f} s; start one with "
                           "`dask worker ... --preload rose.worker --rose-role trainer` (connected now: "
                           f"{_connected(workers)})")
        time.sleep(poll_s)


def _connected(workers: dict[str, dict]) -> str:
    """The scheduler's workers with their ROSE roles, for an error: a restarted worker that connected
    but never reported its role (its plugin did not start) shows as "no ROSE report"."""
    roles = {a: r for r, addrs in roles_of(None, workers).items() for a in addrs}
    return ", ".join(f"{a} ({roles.get(a, 'no ROSE report')})" for a in sorted(workers)) or "none"


JOIN_ATTEMPTS = 3  # times a connecting worker's preparation is tried before the run gives up on it
JOIN_RETRY_S = 10.0  # seconds before the next attempt, times the attempts so far

# What the stimulus ids with which the scheduler removes a worker mean.
_CAUSES = (("handle-worker-cleanup", "its connection to the scheduler closed: the process died, was killed "
                                     "(e.g. out of memory) or lost the network"),
           ("check-worker-ttl", "it missed its heartbeats for distributed.scheduler.worker-ttl"),
           ("retire-workers", "it was retired (scaled down)"),
           ("worker-close-gracefully", "it closed itself (a rollout worker whose engine became unusable restarts; "
                                       "its log says why)"))


class Fleet:
    def __init__(self, client: Client, spec, trainer: str, ready: list[str]):
        self.client = client
        self.spec = spec  # ModelSpec of the run
        self.trainer = trainer
        self.synced: dict[str, int] = {a: 0 for a in ready}  # ready worker -> weight version it holds
        self.joining: dict[str, object] = {}  # address -> Future of its catch-up
        self.catching_up: set[str] = set()  # joining workers that only miss weights (no engine to build)
        self.failed: dict[str, str] = {}  # address -> why it could not join (last attempt)
        self.attempts: collections.Counter = collections.Counter()  # address -> joins tried
        self._retry_at: dict[str, float] = {}  # address -> monotonic time its next join may start
        self.roles: dict[str, list[str]] = {}  # worker addresses by role, as of the last poll
        self.lost: dict[str, str] = {}  # address -> why it left the run (the scheduler's cause, or its unusable engine)
        # Connected workers whose rollout engine is unusable (a weight load into it failed; a sync left
        # them out): address -> why. Not joined again while they stay connected: a dedicated one restarts
        # itself and comes back as a new worker, a serving one serves on until its operator restarts it.
        self.unusable: dict[str, str] = {}
        self.refetches = 0  # shards that arrived bad in catch-up syncs and were fetched again
        self._n = 0

    @property
    def ready(self) -> list[str]:
        return sorted(self.synced)

    def poll(self, version: int) -> None:
        """Notice arrivals and departures; start or finish joins. Cheap: one scheduler call."""
        from rose.ops.train import catch_up

        present = self.check_trainer()
        current = set(rollout_addresses(self.roles))
        # Gone means gone from the scheduler: a worker whose last heartbeat lacked its report is still here.
        for a in [a for a in self.synced if a not in present]:
            self.lost[a] = self.departure(a)
            logger.warning("rollout worker %s left the run (%s)", a, self.lost[a])
            del self.synced[a]
        for a in [a for a in self.unusable if a not in present]:
            del self.unusable[a]
        for a, fut in list(self.joining.items()):
            if a not in present:
                del self.joining[a]
                self.catching_up.discard(a)
            elif fut.done():
                del self.joining[a]
                self.catching_up.discard(a)
                try:
                    status = fut.result()
                except Exception as e:
                    self.failed[a] = f"{type(e).__name__}: {e}"
                    last = self.attempts[a] >= JOIN_ATTEMPTS
                    self._retry_at[a] = time.monotonic() + JOIN_RETRY_S * self.attempts[a]
                    logger.error("worker %s could not join the run (attempt %d of %d%s): %s", a, self.attempts[a],
                                 JOIN_ATTEMPTS, "; giving up on it" if last else "", self.failed[a])
                    continue
                self.synced[a] = status["version"]
                self.refetches += status.get("refetches", 0)
                self.failed.pop(a, None)
                logger.info("worker %s joined the run at weight version %d", a, status["version"])
        now = time.monotonic()
        for a in sorted(current - set(self.synced) - set(self.joining) - set(self.unusable)):
            if a in self.failed and (self.attempts[a] >= JOIN_ATTEMPTS or now < self._retry_at[a]):
                continue
            self.attempts[a] += 1
            self._n += 1
            prep = self.client.submit(prepare_worker, self.spec, workers=[a], pure=False,
                                      key=f"rose-prepare-{a}-{self._n}")
            self.joining[a] = self.client.submit(catch_up, prep, (a,), workers=[self.trainer], pure=False,
                                                 key=f"rose-catch-up-{a}-{self._n}")
            logger.info("worker %s connected mid-run: building its engine, then catching up", a)
        # Ready workers that missed a sync (they joined during the step before) catch up again.
        for a in [a for a, v in self.synced.items() if v < version and a not in self.joining]:
            del self.synced[a]
            self._n += 1
            self.joining[a] = self.client.submit(catch_up, None, (a,), workers=[self.trainer], pure=False,
                                                 key=f"rose-catch-up-{a}-{self._n}")
            self.catching_up.add(a)

    def check_trainer(self) -> set[str]:
        """Refresh `roles`; raise TrainerLost if the run's trainer, or a rank of it (a sharded trainer's
        peer), is no longer connected to the scheduler. Returns the addresses of every connected worker."""
        workers = scheduler_workers(self.client)
        self.roles = roles_of(self.client, workers)
        if self.trainer not in workers:
            raise TrainerLost(f"the trainer worker {self.trainer} left the run ({self.departure(self.trainer)})",
                              worker=self.trainer)
        for peer in getattr(self.spec, "trainer_peers", ()):
            if peer not in workers:
                raise TrainerLost(f"trainer worker {peer}, a rank of the trainer sharded from {self.trainer}, left "
                                  f"the run ({self.departure(peer)})", worker=peer)
        return set(workers)

    def departure(self, addr: str) -> str:
        """Why the scheduler removed `addr`, from the placement plugin's event log (its stimulus id names
        the cause: a closed connection, missed heartbeats, a retirement)."""
        def removed(dask_scheduler, addr=addr):
            plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
            events = plugin.book.events if plugin is not None else ()
            return [e.stimulus_id for e in events if e.kind == "removed" and e.worker == addr][-1:]

        try:
            found = self.client.run_on_scheduler(removed)
        except Exception as e:  # the scheduler is going away too
            return f"cause unknown: {type(e).__name__}: {e}"
        if not found:
            return "the scheduler gave no cause"
        why = next((text for prefix, text in _CAUSES if found[0].startswith(prefix)), "")
        return f"{why}; scheduler stimulus {found[0]}" if why else f"scheduler stimulus {found[0]}"

    def wait_for_worker(self, version: int, timeout_s: float, step: int, poll_s: float = 1.0) -> None:
        """With no rollout worker ready or joining, wait up to `timeout_s` for one to connect (a nanny
        restarting the one that died, a new worker, the elastic scaler); RunError after that."""
        if self.ready or self.joining:
            return
        logger.warning("step %d: no rollout worker is left in the run (lost: %s); waiting up to %.0f s for one",
                       step, self.lost or "none", timeout_s)
        deadline = time.monotonic() + timeout_s
        while not (self.ready or self.joining):
            if time.monotonic() >= deadline:
                raise RunError(f"no rollout worker is left in the run and none connected in {timeout_s:.0f} s "
                               f"(workers lost: {self.lost}; could not join: {self.failed})", step=step)
            time.sleep(poll_s)
            self.poll(version)
        logger.warning("step %d: a rollout worker connected; the run goes on", step)

    def settle(self, version: int, timeout: float = 60.0) -> None:
        """Before a step: let workers that only miss weights (they joined during the last step, after its
        sync was planned) catch up, so this step's rollouts and sync include them. A worker still
        building its engine is not waited for; it joins when ready."""
        from distributed import wait

        self.poll(version)
        quick = [self.joining[a] for a in self.catching_up if a in self.joining]
        if quick:
            try:
                with self.client.as_current():
                    wait(quick, timeout=timeout)
            except TimeoutError:
                logger.warning("catch-up syncs of %d workers took over %.0f s; the step goes on without them",
                               len(quick), timeout)
            self.poll(version)

    def synced_to(self, statuses: list[dict], unusable: dict[str, str] | None = None) -> None:
        """A sync's outcome: each receiver's new version (`statuses`), and the receivers it left out
        because their engines are unusable (address -> why): those leave the run."""
        for s in statuses:
            if s["worker"] in self.synced:
                self.synced[s["worker"]] = s["weight_version"]
        for a, why in (unusable or {}).items():
            if self.synced.pop(a, None) is not None:
                self.lost[a] = why
                logger.error("rollout worker %s left the run (%s)", a, self.lost[a])
            self.unusable[a] = why
