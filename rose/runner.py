"""`rose.run`: drive a pipeline's RL steps on a cluster and return a `Report`.

The run's actions (start a step, wait for its rollouts, submit its train and sync parts, finish it)
come in the order `rose.schedule.plan_run` gives for the pipeline's staleness; each step in flight is
a `rose.step.Step`. In asynchronous mode (`Pipeline.staleness=1`) step k+1's rollouts run on the
weights from before step k's training while the trainer works; step k+1 then trains on data one
version old, and GRPO's importance weight against the engines' recorded log-probs corrects for it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable

import pandas as pd
import pyarrow as pa
from distributed import Client

from rose.errors import ConfigError, RunError
from rose.fleet import Fleet, roles_of
from rose.pipeline import Pipeline, load_pipeline
from rose.report import STEP_COLUMNS, Report
from rose.runtime.protocol import ModelSpec, rollout_addresses
from rose.runtime.trajectory import TRAJECTORY_SCHEMA
from rose.runtime.worker.plugin import prepare_worker
from rose.schedule import plan_run
from rose.step import Step

logger = logging.getLogger("rose.run")


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
        staleness: int | None = None) -> Report:
    """Run `steps` RL steps of `pipeline` and return a Report.

    `cluster`: None (start a LocalRoseCluster for this run), a LocalRoseCluster or any Dask cluster
    object, a `distributed.Client`, or a scheduler address ("tcp://host:8786"). `staleness` overrides
    the pipeline's (0: synchronous, 1: the next step's rollouts overlap this step's training).

        report = rose.run("pipelines/guess.py", steps=20)
        report.metrics        # pandas DataFrame, one row per step
        report.plot("reward.png")
    """
    if isinstance(pipeline, str):
        pipeline = load_pipeline(pipeline)
    if seed is not None:
        pipeline = replace(pipeline, seed=seed)
    if staleness is not None:
        pipeline = replace(pipeline, staleness=staleness)  # validated there
    steps = pipeline.steps if steps is None else steps
    if steps < 1:
        raise ConfigError(f"steps={steps} must be >= 1")
    pipeline.build(0).validate_step()  # malformed graphs fail here, before any cluster work

    from rose.envs import env_class

    from rose.models import prepare_model

    # The warm start does not depend on the run seed: every seed starts from the same cached model.
    model_dir = prepare_model(pipeline.model, env_class(pipeline.env), progress=progress)
    spec = ModelSpec(model_dir, pipeline.model.max_model_len, pipeline.engine, pipeline.seed)

    owned = []
    if cluster is None:
        from rose.runtime.cluster import LocalRoseCluster

        cluster = LocalRoseCluster(pipeline.cluster, pipeline.engine)
        owned.append(cluster)
    if isinstance(cluster, Client):
        client = cluster
    else:
        client = Client(cluster)
        owned.insert(0, client)
    try:
        return _run(pipeline, client, spec, steps, progress, on_step)
    finally:
        for thing in owned:
            thing.close()


def _run(pipeline, client, spec, steps, progress, on_step) -> Report:
    from tqdm.auto import tqdm

    roles = roles_of(client)
    if not roles.get("trainer"):
        raise ConfigError(f"the cluster has no trainer worker (roles: {roles}); start one with "
                          "`dask worker ... --preload rose.worker --rose-role trainer`")
    rollout_workers = rollout_addresses(roles)
    if not rollout_workers:
        raise ConfigError(f"the cluster has no rollout worker (roles: {roles})")
    _check_placement(client)
    trainer = roles["trainer"][0]
    t0 = time.perf_counter()
    prepared = client.gather([client.submit(prepare_worker, spec, workers=[a], pure=False, key=f"rose-prepare-{a}")
                              for a in [trainer] + rollout_workers])
    logger.info("workers prepared in %.1f s: %s", time.perf_counter() - t0, prepared)
    run = _Run(pipeline, client, Fleet(client, spec, trainer, rollout_workers))
    with tqdm(total=steps, desc=pipeline.name, disable=not progress, unit="step") as bar:
        for action in plan_run(steps, pipeline.staleness):
            row = run.do(action)
            if row is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward_mean']:.3f}", failed=row["failed"])
                if on_step:
                    on_step(row)
    return run.report()


class _Run:
    """The run's state between actions: the steps in flight, the rows and trajectories of finished ones."""

    def __init__(self, pipeline, client, fleet: Fleet):
        self.pipeline, self.client, self.fleet = pipeline, client, fleet
        self.inflight: dict[int, Step] = {}
        self.version = 0  # weights the engines hold: those of the last finished step
        self.rows: list[dict] = []
        self.tables: list[pa.Table] = []
        self.t_last = time.perf_counter()

    def do(self, action) -> dict | None:
        """Carry out one action; a finished step's row for `finish`. Raises RunError with the report so far."""
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
            else:
                return self._record(self.inflight[action.step])
        except Exception as e:
            # Keep what the finished steps produced: the caller (and `rose run`) can save it.
            err = RunError(f"step {action.step} failed: {type(e).__name__}: {e}", step=action.step,
                           weight_version=self.version)
            err.report = self.report()
            for st in self.inflight.values():
                st.release()
            raise err from e

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
        row["workers_lost"] = len(self.fleet.lost) - sum(r["workers_lost"] for r in self.rows)
        self.rows.append(row)
        return row

    def report(self) -> Report:
        trajectories = pa.concat_tables(self.tables) if self.tables else TRAJECTORY_SCHEMA.empty_table()
        return Report(self.pipeline.name, pd.DataFrame(self.rows, columns=STEP_COLUMNS), trajectories,
                      sum(r["lost"] for r in self.rows), sum(r["duplicated"] for r in self.rows),
                      len(self.fleet.lost))
