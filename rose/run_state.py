"""The state of one run between its actions (`rose.runner`): the steps in flight, the rows and
trajectories of finished ones, worker preparation and checkpoints."""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace

import pyarrow as pa

from rose.checkpoint import Checkpoint, RunDir
from rose.errors import RunError
from rose.fleet import Fleet, TrainerLost, roles_of, wait_for_trainer
from rose.report import Report, metrics_frame
from rose.runtime.protocol import ModelSpec, rollout_addresses
from rose.runtime.trajectory import TRAJECTORY_SCHEMA
from rose.runtime.worker.plugin import prepare_worker
from rose.step import Step, await_futures

logger = logging.getLogger("rose.run")


class RunState:
    """The run's state between actions: the steps in flight, the rows and trajectories of finished ones."""

    def __init__(self, pipeline, client, steps: int, run_dir: RunDir, persist: bool, rows: list[dict],
                 tables: list[pa.Table], trainer_restarts: int, redone: list[dict], prepare_s: float = 0.0,
                 early_sync: bool = False):
        self.pipeline, self.client, self.steps = pipeline, client, steps
        self.run_dir, self.persist = run_dir, persist  # persist: also write the report at each checkpoint
        self.fleet: Fleet | None = None
        self.inflight: dict[int, Step] = {}
        self.version = 0  # weights the engines hold: those of the last finished step
        self.rows: list[dict] = list(rows)
        self.tables: list[pa.Table] = list(tables)
        self.trainer_restarts = trainer_restarts
        self.redone = redone  # rows replaced by a redo: their departures and refetches still happened
        self.saved: dict[int, Checkpoint] = {}  # step -> its checkpoint, written, not yet committed
        self._lost_counted = 0  # of fleet.lost, departures already in a row
        self._refetches_counted = 0  # of fleet.refetches, already in a row
        self.t_last = time.perf_counter()
        self.prepare_s = prepare_s  # s spent preparing workers (engine builds), this run's earlier tries included
        # Asynchronous steps: submit a step's sync as soon as the next step has started (`_start`), to stage
        # its version while that step's rollouts run and commit it on each engine once that engine runs
        # none of them and none can come back to it, and the next step's train
        # task, to start once its rewards are in and this step's train task has ended. Needs the plugin.
        self.early_sync = early_sync

    def prepare(self, spec: ModelSpec, ckpt: Checkpoint | None, gone: str | None) -> None:
        """Build every worker's engine or trainer for the run, from `ckpt`'s weights if given."""
        trainer = wait_for_trainer(self.client, self.pipeline.cluster.worker_wait_s, gone=gone)
        if ckpt is not None:
            spec = replace(spec, weights_dir=ckpt.path, version=ckpt.weight_version)
        roles = roles_of(self.client)
        rollout_workers = rollout_addresses(roles)
        # The other trainer workers: ranks of a trainer sharded over them all, driven by this one.
        spec = replace(spec, trainer_peers=tuple(a for a in roles.get("trainer", []) if a != trainer))
        self.fleet = Fleet(self.client, spec, trainer, [])
        self._lost_counted = self._refetches_counted = 0  # a new fleet counts from zero
        self.version = spec.version
        t0 = time.perf_counter()
        tag = uuid.uuid4().hex[:8]  # keys of an earlier preparation (a replaced trainer) are not reused
        futures = [self.client.submit(prepare_worker, spec, workers=[a], pure=False, key=f"rose-prepare-{a}-{tag}")
                   for a in [trainer] + rollout_workers]
        by_addr = dict(zip([trainer] + rollout_workers, futures))

        def check() -> None:
            # A rollout worker that leaves while it builds its engine (its process died: a crash in the
            # engine, the OOM killer) would hold its preparation, pinned to its address, forever: the run
            # goes on without it, and it joins as any new worker does once it connects again.
            present = self.fleet.check_trainer()
            for a in [a for a in rollout_workers if a not in present and a in by_addr and not by_addr[a].done()]:
                self.fleet.lost[a] = self.fleet.departure(a)
                logger.warning("rollout worker %s left while preparing (%s): the run goes on without it",
                               a, self.fleet.lost[a])
                futures.remove(by_addr.pop(a))  # in place: await_futures waits on this list

        await_futures(self.client, futures, check)
        prepared = self.client.gather(futures)
        self.fleet.synced = {a: spec.version for a in rollout_workers if a in by_addr}
        self.prepare_s += time.perf_counter() - t0
        logger.info("workers prepared in %.1f s: %s", time.perf_counter() - t0, prepared)

    def do(self, action) -> dict | None:
        """Carry out one action; a finished step's row for `finish`. Raises RunError with the report so
        far, or TrainerLost (the runner restores a trainer)."""
        try:
            if action.kind == "start":
                self.inflight[action.step] = self._start(action.step)
            elif action.kind == "wait":
                self.inflight[action.step].wait()
            elif action.kind in ("train", "sync"):
                self.inflight[action.step].submit(action.kind)
            elif action.kind == "trained":
                self.inflight[action.step].wait_trained()
                if self._checkpoint_due(action.step):
                    self._save(self.inflight[action.step])
            else:
                return self._record(self.inflight[action.step])
        except TrainerLost:
            raise
        except Exception as e:
            self._raise_if_trainer_lost(e)
            # Keep what the finished steps produced: the caller (and `rose run`) can save it.
            err = RunError(f"step {action.step} failed: {type(e).__name__}: {e}", step=action.step,
                           weight_version=self.version)
            err.report = self.report()
            self.release()
            raise err from e

    def _raise_if_trainer_lost(self, e: Exception) -> None:
        """A step that failed because a worker of the trainer left (a sharded trainer's collective fails
        at once when a rank dies, before any poll sees the departure) raises TrainerLost, not RunError:
        the runner rebuilds the trainer on the trainer workers still there."""
        if self.fleet is None:
            return
        try:
            self.fleet.check_trainer()
        except TrainerLost as lost:
            raise lost from e
        except Exception:  # noqa: BLE001 - the scheduler unreachable too: report the step's own failure
            return

    def _start(self, step: int) -> Step:
        """Start `step` on the weights of the last finished step, or, with the step two before still in
        flight (asynchronous steps started on its sync: `plan_run(start_on_sync=True)`), on that step's,
        which its sync is bringing to the engines."""
        before = self.inflight.get(step - 2)
        version = before.trained_version() if before is not None else self.version
        st = Step.start(self.pipeline, self.client, self.fleet, step, version, held=self.version, synced=before)
        prev = self.inflight.get(step - 1)  # asynchronous: trained (or training) while `st` rolls out
        if (self.early_sync and prev is not None and "train" in prev.submitted_at and "sync" not in prev.submitted_at
                and st.samples_once):
            prev.submit_sync_after(st)
            if not self._checkpoint_due(prev.step):  # a checkpoint is written between the two train steps
                st.submit_train_after(prev)
        return st

    def _checkpoint_due(self, step: int) -> bool:
        every = self.pipeline.checkpoint_every
        return every > 0 and ((step + 1) % every == 0 or step == self.steps - 1)

    def _save(self, st: Step) -> None:
        """The trainer writes its state after step `st` (before the next train step is submitted)."""
        from rose.ops.train import save_checkpoint

        version = st.trained_version()
        path = self.run_dir.new_path(st.step)
        fut = self.client.submit(save_checkpoint, path, version, workers=[self.fleet.trainer], pure=False,
                                 key=f"rose-checkpoint-{st.step}-{uuid.uuid4().hex[:8]}")
        await_futures(self.client, [fut], lambda: self.fleet.poll(self.version))
        info = fut.result()
        logger.info("step %d: checkpoint of weight version %d written in %.1f s: %s", st.step, version,
                    info["seconds"], path)
        p = self.pipeline
        self.saved[st.step] = Checkpoint(st.step, version, path, p.name, p.seed, p.staleness)

    def _record(self, st: Step) -> dict:
        try:
            row, table = st.finish()
        finally:
            st.release()
        del self.inflight[st.step]
        now = time.perf_counter()
        row["step_s"], self.t_last = now - self.t_last, now
        self.version = row["weight_version"]
        self.tables.append(table)
        row["workers_lost"], self._lost_counted = len(self.fleet.lost) - self._lost_counted, len(self.fleet.lost)
        fresh, self._refetches_counted = self.fleet.refetches - self._refetches_counted, self.fleet.refetches
        row["sync_refetches"] += fresh  # of catch-up syncs (workers that joined), which run beside the steps
        self.rows.append(row)
        ckpt = self.saved.pop(st.step, None)
        if ckpt is not None:  # the report first, then the pointer: a resume finds both at this step
            if self.persist:
                # No plot: drawing reward.png took 0.9-1.4 s on a 2-core host, 5-17 times the rest of the
                # report (50-200 steps), and a resume reads none of it. The run's end draws it (`rose run` also when a run fails).
                self.report().save(self.run_dir.root, plot=False)
            self.run_dir.commit(ckpt)
        return row

    def upto(self, step: int) -> tuple[list[dict], list[pa.Table]]:
        """The rows and trajectories of steps 0..`step` (those a checkpoint holds)."""
        import pyarrow.compute as pc

        return ([r for r in self.rows if r["step"] <= step],
                [t.filter(pc.less_equal(t["step"], step)) for t in self.tables])

    def release(self) -> None:
        for st in self.inflight.values():
            st.release()
        self.inflight.clear()

    def report(self) -> Report:
        trajectories = pa.concat_tables(self.tables) if self.tables else TRAJECTORY_SCHEMA.empty_table()
        every = self.rows + self.redone  # departures and refetches of redone steps happened too
        return Report(self.pipeline.name, metrics_frame(self.rows), trajectories,
                      sum(r["lost"] for r in self.rows), sum(r["duplicated"] for r in self.rows),
                      sum(r["workers_lost"] for r in every), self.trainer_restarts,
                      sum(r["sync_refetches"] for r in every), self.prepare_s)
