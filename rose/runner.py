"""`rose.run`: drive a pipeline's RL steps on a cluster and return a `Report`.

The run's actions (start a step, wait for its rollouts, submit its train and sync parts, finish it)
come in the order `rose.schedule.plan_run` gives for the pipeline's staleness; each step in flight is
a `rose.step.Step`. In asynchronous mode (`Pipeline.staleness=1`) step k+1's rollouts run on the
weights from before step k's training while the trainer works; step k+1 then trains on data one
version old, and GRPO's importance weight against the engines' recorded log-probs corrects for it.

Every `Pipeline.checkpoint_every` steps, and after the last, the trainer writes a checkpoint into the
run directory (`rose.checkpoint`). `resume=RUN_DIR` continues a run from its latest checkpoint. If the
trainer worker leaves mid-run, the runner waits for a new one (a nanny restarts it), prepares every
worker from the latest checkpoint (the model's own weights if there is none yet) and redoes the steps
after it, up to `TRAINER_RESTARTS` times.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import replace
from typing import Callable

import pyarrow as pa
from distributed import Client

from rose.checkpoint import Checkpoint, RunDir
from rose.errors import ConfigError, RunError
from rose.fleet import Fleet, TrainerLost, roles_of, wait_for_trainer
from rose.pipeline import Pipeline, load_pipeline, overridden
from rose.report import Report, metrics_frame
from rose.runtime.protocol import ModelSpec, rollout_addresses
from rose.runtime.trajectory import TRAJECTORY_SCHEMA
from rose.runtime.worker.plugin import prepare_worker
from rose.schedule import plan_run
from rose.step import Step, await_futures

logger = logging.getLogger("rose.run")

TRAINER_RESTARTS = 3  # trainer workers replaced in one run before it fails


def _check_placement(client: Client) -> str | None:
    """The scheduler's placement policy, or None (with one warning) if it runs without rose.plugin."""
    from rose.runtime.scheduler.plugin import get_plugin

    def policy(dask_scheduler):
        plugin = get_plugin(dask_scheduler)
        return plugin.policy if plugin is not None else None

    found = client.run_on_scheduler(policy)
    if found is None:
        logger.warning("the scheduler runs without the ROSE placement plugin: rollouts go to rollout workers by "
                       "Dask's own scheduling (no serving-capacity awareness, no shedding). Start it with "
                       "`dask scheduler --preload rose.plugin`.")
    return found


def run(pipeline: Pipeline | str, cluster=None, steps: int | None = None, seed: int | None = None,
        progress: bool = True, on_step: Callable[[dict], None] | None = None,
        staleness: int | None = None, out: str | None = None, resume: str | None = None,
        checkpoint_every: int | None = None, algorithm: str | None = None) -> Report:
    """Run `steps` RL steps of `pipeline` and return a Report.

    `cluster`: None (start a LocalRoseCluster for this run), a LocalRoseCluster or any Dask cluster
    object, a `distributed.Client`, or a scheduler address ("tcp://host:8786"). `staleness` overrides
    the pipeline's (0: synchronous, 1: the next step's rollouts overlap this step's training).
    `out`: the run directory: the report (metrics.csv, trajectories.parquet, ...) is written there at
    every checkpoint and at the end, the checkpoints under `out/checkpoints` (None: checkpoints go to
    a temporary directory, removed after the run; they serve only to replace a lost trainer).
    `resume`: a run directory to continue from its latest checkpoint, up to `steps` steps in all
    (metrics and trajectories append; `out` defaults to it). `algorithm`: "grpo" or "dapo" for every
    train node of the pipeline (None: as the pipeline says).

        report = rose.run("pipelines/guess.py", steps=20)
        report.metrics        # pandas DataFrame, one row per step
        report.plot("reward.png")
    """
    if isinstance(pipeline, str):
        pipeline = load_pipeline(pipeline)
    pipeline = overridden(pipeline, seed=seed, staleness=staleness, checkpoint_every=checkpoint_every,
                          algorithm=algorithm)
    steps = pipeline.steps if steps is None else steps
    if steps < 1:
        raise ConfigError(f"steps={steps} must be >= 1")
    pipeline.build(0).validate_step()  # malformed graphs fail here, before any cluster work
    resume_from = None
    if resume is not None:
        resume_from = RunDir(resume).resume_point(pipeline.name, pipeline.seed, pipeline.staleness)
        if resume_from.step + 1 >= steps:
            raise ConfigError(f"the run in {resume!r} has finished steps 0..{resume_from.step}: ask for more than "
                              f"steps={steps} to continue it")
        out = out or resume
    run_dir = RunDir(out if out is not None else tempfile.mkdtemp(prefix="rose-run-"))

    from rose.envs import env_class

    from rose.models import prepare_model

    # The warm start does not depend on the run seed: every seed starts from the same cached model.
    model_dir = prepare_model(pipeline.model, env_class(pipeline.env), progress=progress)
    spec = ModelSpec(model_dir, pipeline.model.max_model_len, pipeline.engine, pipeline.seed)

    owned = []
    try:
        if cluster is None:
            from rose.runtime.cluster import LocalRoseCluster

            cluster = LocalRoseCluster(pipeline.cluster, pipeline.engine)
            owned.append(cluster)
        if isinstance(cluster, Client):
            client = cluster
        else:
            client = Client(cluster)
            owned.insert(0, client)
        history = RunDir(resume).history(resume_from.step) if resume_from else ([], [])
        return _run(pipeline, client, spec, steps, progress, on_step, run_dir, out is not None, resume_from, history)
    finally:
        for thing in owned:
            thing.close()
        if out is None:
            shutil.rmtree(run_dir.root, ignore_errors=True)


def _run(pipeline, client, spec, steps, progress, on_step, run_dir, persist, ckpt, history) -> Report:
    from tqdm.auto import tqdm

    roles = roles_of(client)
    if not roles.get("trainer"):
        raise ConfigError(f"the cluster has no trainer worker (roles: {roles}); start one with "
                          "`dask worker ... --preload rose.worker --rose-role trainer`")
    if not rollout_addresses(roles):
        raise ConfigError(f"the cluster has no rollout worker (roles: {roles})")
    _check_placement(client)
    rows, tables = history
    restarts, gone = 0, None
    redone: list[dict] = []  # rows of steps a trainer loss made the run do again
    with tqdm(total=steps, initial=len(rows), desc=pipeline.name, disable=not progress, unit="step") as bar:
        while True:
            run = _Run(pipeline, client, steps, run_dir, persist, rows, tables, restarts, redone)
            try:
                run.prepare(spec, ckpt, gone)
                for action in plan_run(steps, pipeline.staleness, first=len(rows)):
                    row = run.do(action)
                    if row is not None:
                        bar.update(1)
                        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", failed=row["failed"])
                        if on_step:
                            on_step(row)
            except TrainerLost as e:
                run.release()
                restarts, gone = restarts + 1, run.fleet.trainer if run.fleet else None
                if restarts > TRAINER_RESTARTS:
                    err = RunError(f"the trainer was lost {restarts} times (last: {e}); giving up", step=len(run.rows))
                    err.report = run.report()
                    raise err from e
                ckpt = run_dir.latest()
                done = ckpt.step if ckpt else -1
                logger.warning("%s; restoring a new trainer from %s and redoing steps %d.. (restart %d of %d)", e,
                               f"the checkpoint of step {done}" if ckpt else "the model (no checkpoint yet)",
                               done + 1, restarts, TRAINER_RESTARTS)
                redone = redone + [r for r in run.rows if r["step"] > done]
                rows, tables = run.upto(done)
                bar.n = len(rows)
                bar.refresh()
                continue
            if persist:
                run.report().save(run_dir.root)
            return run.report()


class _Run:
    """The run's state between actions: the steps in flight, the rows and trajectories of finished ones."""

    def __init__(self, pipeline, client, steps: int, run_dir: RunDir, persist: bool, rows: list[dict],
                 tables: list[pa.Table], trainer_restarts: int, redone: list[dict]):
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

    def prepare(self, spec: ModelSpec, ckpt: Checkpoint | None, gone: str | None) -> None:
        """Build every worker's engine or trainer for the run, from `ckpt`'s weights if given."""
        trainer = wait_for_trainer(self.client, self.pipeline.cluster.worker_wait_s, gone=gone)
        if ckpt is not None:
            spec = replace(spec, weights_dir=ckpt.path, version=ckpt.weight_version)
        rollout_workers = rollout_addresses(roles_of(self.client))
        self.fleet = Fleet(self.client, spec, trainer, [])
        self._lost_counted = self._refetches_counted = 0  # a new fleet counts from zero
        self.version = spec.version
        t0 = time.perf_counter()
        tag = uuid.uuid4().hex[:8]  # keys of an earlier preparation (a replaced trainer) are not reused
        futures = [self.client.submit(prepare_worker, spec, workers=[a], pure=False, key=f"rose-prepare-{a}-{tag}")
                   for a in [trainer] + rollout_workers]
        await_futures(self.client, futures, self.fleet.check_trainer)
        prepared = self.client.gather(futures)
        self.fleet.synced = {a: spec.version for a in rollout_workers}
        logger.info("workers prepared in %.1f s: %s", time.perf_counter() - t0, prepared)

    def do(self, action) -> dict | None:
        """Carry out one action; a finished step's row for `finish`. Raises RunError with the report so
        far, or TrainerLost (the runner restores a trainer)."""
        try:
            if action.kind == "start":
                self.inflight[action.step] = Step.start(self.pipeline, self.client, self.fleet, action.step,
                                                        self.version)
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
            # Keep what the finished steps produced: the caller (and `rose run`) can save it.
            err = RunError(f"step {action.step} failed: {type(e).__name__}: {e}", step=action.step,
                           weight_version=self.version)
            err.report = self.report()
            self.release()
            raise err from e

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
                self.report().save(self.run_dir.root)
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
                      sum(r["sync_refetches"] for r in every))

