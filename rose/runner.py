"""`rose.run`: drive a pipeline's RL steps on a cluster and return a `Report`.

Per step: build the step graph, validate it (before any worker does work), lower it to Dask tasks,
submit, and wait in phases (rollout, train, sync) so each phase is timed.
- Synchronous mode (`Pipeline.staleness=0`): step k's rollouts all use weights version k, because step
  k-1's sync finished before they were submitted.
- Asynchronous mode (`staleness=1`): step k+1's rollouts are submitted with step k's train step and run
  on version k while the trainer makes version k+1, so rollout capacity outside the trainer's devices
  overlaps training. Step k+1 then trains on data one version old; GRPO's importance weight against the
  engines' recorded log-probs corrects for it. The sync of step k waits for step k+1's rollouts, so
  weights never change under a running trajectory and every trajectory comes from one version.
"""
from __future__ import annotations

import collections
import logging
import time
from dataclasses import replace
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
from distributed import Client, wait

from rose.errors import ConfigError, GraphError, RunError
from rose.fleet import Fleet, roles_of
from rose.graph import LowerContext, lower
from rose.graph.submit import submit
from rose.pipeline import Pipeline, load_pipeline
from rose.report import Report
from rose.runtime.trajectory import TRAJECTORY_SCHEMA, concat
from rose.worker import ROLLOUT_ROLES, ModelSpec, prepare_worker

logger = logging.getLogger("rose.run")

STEP_COLUMNS = ["step", "weight_version", "rollout_version", "reward_mean", "reward_std", "trajectories", "failed",
                "tokens", "rollout_s", "train_s", "trainer_compute_s", "sync_s", "step_s", "rollout_tok_s",
                "logprob_mismatch", "loss", "sync_bytes", "sync_refetches"]


def _check_placement(client: Client) -> str | None:
    """The scheduler's placement policy, or None (with one warning) if it runs without rose.plugin."""
    from rose.plugin import get_plugin

    def policy(dask_scheduler):
        plugin = get_plugin(dask_scheduler)
        return plugin.policy if plugin is not None else None

    found = client.run_on_scheduler(policy)
    if found is None:
        logger.warning("the scheduler runs without the ROSE placement plugin: rollouts go to rollout workers by "
                       "Dask's own scheduling (no serving-capacity awareness, no shedding). Start it with "
                       "`dask scheduler --preload rose.plugin`.")
    return found


def _one_node(graph, op: str):
    nodes = [n for n in graph.nodes.values() if n.op == op]
    if len(nodes) != 1:
        raise GraphError(f"a step graph needs exactly one {op!r} node, found {len(nodes)}", graph=graph.name)
    return nodes[0]


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
    pipeline.build(0).validate()  # malformed graphs fail here, before any cluster work

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
    rollout_workers = sorted(a for r in ROLLOUT_ROLES for a in roles.get(r, []))
    if not rollout_workers:
        raise ConfigError(f"the cluster has no rollout worker (roles: {roles})")
    _check_placement(client)
    trainer = roles["trainer"][0]
    t0 = time.perf_counter()
    prepared = client.gather([client.submit(prepare_worker, spec, workers=[a], pure=False, key=f"rose-prepare-{a}")
                              for a in [trainer] + rollout_workers])
    logger.info("workers prepared in %.1f s: %s", time.perf_counter() - t0, prepared)
    fleet = Fleet(client, spec, trainer, rollout_workers)

    rows, tables = [], []
    seen: collections.Counter = collections.Counter()
    expected: set[str] = set()
    version = 0

    def report() -> Report:
        trajectories = pa.concat_tables(tables) if tables else TRAJECTORY_SCHEMA.empty_table()
        lost = len(expected - set(seen))
        duplicated = sum(1 for c in seen.values() if c > 1)
        return Report(pipeline.name, pd.DataFrame(rows, columns=STEP_COLUMNS), trajectories, lost, duplicated)

    bar = tqdm(range(steps), desc=pipeline.name, disable=not progress, unit="step")
    staleness = pipeline.staleness
    current: _Step | None = None
    t_last = time.perf_counter()
    for step in bar:
        nxt = None
        try:
            if current is None:  # the first step, or every step in synchronous mode
                parts = () if staleness else ("train", "sync")
                current = _Step.start(pipeline, client, fleet, step, version, parts)
            current.wait_rollouts()
            if staleness:
                # Asynchronous mode: train this step while the next step's rollouts run on the weights the
                # engines hold now (one version behind the trainer's by the time it trains on them). The
                # train task is running by now (submitted last step, or just below), so the placement
                # plugin keeps a colocated worker out of the next rollouts from the start.
                if "train" not in current.submitted_at:
                    current.wait_rewards()
                    current.submit("train")
                if step + 1 < steps:
                    nxt = _Step.start(pipeline, client, fleet, step + 1, version, ())
            metrics = current.train_metrics()
            if staleness:
                if nxt is not None:
                    # Weights swap only between steps: the sync waits for the next step's rollouts, so no
                    # trajectory mixes versions (their rollout phase is usually over by now).
                    nxt.wait_rollouts()
                    nxt.wait_rewards()
                current.submit("sync")
                if nxt is not None:
                    # The next train step runs while this sync moves the new version (no round trip
                    # through the driver); it publishes only once the sync is done reading this one.
                    nxt.submit("train", publish_after_sync=metrics["weight_version"])
            row, table = current.finish(metrics)
        except Exception as e:
            # Keep what the finished steps produced: the caller (and `rose run`) can save it.
            err = RunError(f"step {step} failed: {type(e).__name__}: {e}", step=step, weight_version=version)
            err.report = report()
            if nxt is not None:
                nxt.release()
            raise err from e
        finally:
            if current is not None:
                current.release()
        now = time.perf_counter()
        row["step_s"], t_last = now - t_last, now
        expected |= current.ids
        version = row["weight_version"]
        tables.append(table)
        seen.update(table["trajectory_id"].to_pylist())
        rows.append(row)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", failed=row["failed"])
        if on_step:
            on_step(row)
        current = nxt
    return report()


def _wait_rollouts(futures, fleet: Fleet, version: int, poll_s: float = 0.5) -> None:
    """Wait for a step's rollouts; meanwhile let workers that connect join the run."""
    while True:
        try:
            wait(futures, timeout=poll_s)
            return
        except TimeoutError:
            fleet.poll(version)


class _Step:
    """One RL step in flight: its lowered graph, submitted in parts ("gen": prompts, rollouts and rewards;
    "train"; "sync"), and its phase timings. Synchronous mode submits all parts at once; asynchronous
    mode holds back train and sync until the runner says."""

    def __init__(self, client, fleet: Fleet, step: int, version: int, graph, lowered):
        self.client, self.fleet, self.step, self.version = client, fleet, step, version
        self.lowered = lowered
        self.nodes = {op: _one_node(graph, op).name for op in ("rollout", "reward", "train", "sync")}
        rollout = graph.nodes[self.nodes["rollout"]]
        self.ids = {s.trajectory_id for s in lowered.outputs[(rollout.inputs["specs"].node, "specs")]}
        # Without the placement plugin, rollouts may go to any rollout worker (Dask decides).
        self.roles = dict(fleet.roles)  # as of the poll that began this step
        self.roles["rollout"] = sorted(a for r in ROLLOUT_ROLES for a in self.roles.get(r, []))
        self.futures: dict = {}
        self.submitted_at: dict[str, float] = {}
        self.rollout_s = None  # s from submission to the last rollout done
        self.train_s = None  # s from when training could start to its metrics
        self.batches = None  # the step's scored trajectories, gathered by the driver
        self._done_at: list[float] = []
        self._n_rollouts = 0

    @classmethod
    def start(cls, pipeline, client, fleet: Fleet, step: int, version: int, parts: tuple[str, ...]) -> "_Step":
        """Build, validate and lower the step's graph; submit its rollouts (and `parts`)."""
        fleet.settle(version)
        if not fleet.ready and not fleet.joining:
            raise RunError("no rollout worker is left in the run", step=step)
        graph = pipeline.build(step)
        ctx = LowerContext(step, version, graph.name, tuple(fleet.ready), pipeline.seed,
                           pipeline.engine.temperature, pipeline.engine.top_p)
        st = cls(client, fleet, step, version, graph, lower(graph, ctx))
        st.submit("gen", *parts)
        # When each rollout finished: the rollout phase is timed to the last, even when the runner looks
        # later (asynchronous mode looks after the train step it overlapped).
        rollouts = st._futures("rollout", "trajectories")
        for f in rollouts:
            f.add_done_callback(lambda _f: st._done_at.append(time.perf_counter()))
        st._n_rollouts = len(rollouts)
        return st

    def submit(self, *parts: str, publish_after_sync: int | None = None) -> None:
        """Submit these parts of the step; `publish_after_sync` goes to the training task."""
        part_of = {self.nodes["train"]: "train", self.nodes["sync"]: "sync"}
        tasks = [t for t in self.lowered.tasks if part_of.get(t.node, "gen") in parts]
        if publish_after_sync is not None:
            # the train op's training task (annotated rose-trains) takes this argument
            tasks = [replace(t, kwargs={**t.kwargs, "publish_after_sync": publish_after_sync})
                     if t.annotations.get("rose-trains") else t for t in tasks]
        now = time.perf_counter()
        self.submitted_at.update({p: now for p in parts})
        self.futures = submit(self.client, tasks, self.roles, self.futures)

    def _futures(self, op: str, port: str) -> list:
        return [self.futures[k] for k in self.lowered.keys_of(self.nodes[op], port)]

    def wait_rollouts(self) -> None:
        if self.rollout_s is None:
            _wait_rollouts(self._futures("rollout", "trajectories"), self.fleet, self.version)
            done = max(self._done_at) if len(self._done_at) == self._n_rollouts else time.perf_counter()
            self.rollout_s = done - self.submitted_at["gen"]

    def wait_rewards(self) -> None:
        wait(self._futures("reward", "trajectories"))

    def gather_batches(self) -> None:
        if self.batches is None:
            self.batches = self.client.gather(self._futures("reward", "trajectories"))

    def train_metrics(self) -> dict:
        self.gather_batches()
        metrics = self.client.gather(self._futures("train", "metrics")[0])
        # From when it could start: submitted and its rollouts done.
        ready = max(self.submitted_at["train"], self.submitted_at["gen"] + self.rollout_s)
        self.train_s = time.perf_counter() - ready
        return metrics

    def finish(self, metrics: dict) -> tuple[dict, pa.Table]:
        """Wait for the sync; check every engine took the trained version; the step's row and table."""
        t0 = time.perf_counter()
        syncs = self.client.gather(self._futures("sync", "status"))
        sync_s = time.perf_counter() - max(t0, self.submitted_at["sync"])
        statuses = [s for sync_result in syncs for s in sync_result["statuses"]]
        self.fleet.synced_to(statuses)
        new_versions = {s["weight_version"] for s in statuses}
        if new_versions != {metrics["weight_version"]}:
            raise RunError(f"engines hold weight versions {sorted(new_versions)} after sync, the trainer "
                           f"{metrics['weight_version']}", step=self.step)
        table = concat(self.batches)
        row = _step_row(self.step, metrics["weight_version"], table, metrics, self.rollout_s, self.train_s, sync_s)
        row["rollout_version"] = self.version
        row["sync_bytes"] = sum(s.get("sent_bytes", 0) for s in syncs)
        row["sync_refetches"] = sum(s.get("refetches", 0) for s in syncs)
        return row, table

    def release(self) -> None:
        for f in self.futures.values():
            f.release()
        self.futures = {}


def _step_row(step, version, table, metrics, rollout_s, train_s, sync_s) -> dict:
    fr = np.asarray(table["finish_reason"].to_pylist())
    rewards = table["reward"].to_numpy(zero_copy_only=False)
    ok = fr != "failed"
    masks = table["loss_mask"].combine_chunks()
    tokens = int(np.asarray(masks.values.to_numpy(zero_copy_only=False)).sum())
    return {"step": step, "weight_version": version,
            "reward_mean": float(np.mean(rewards[ok])) if ok.any() else float("nan"),
            "reward_std": float(np.std(rewards[ok])) if ok.any() else float("nan"),
            "trajectories": table.num_rows, "failed": int((~ok).sum()), "tokens": tokens,
            "rollout_s": rollout_s, "train_s": train_s, "trainer_compute_s": metrics.get("train_s", float("nan")),
            "sync_s": sync_s,
            "rollout_tok_s": tokens / rollout_s if rollout_s > 0 else float("nan"),
            "logprob_mismatch": metrics.get("logprob_mismatch", float("nan")),
            "loss": metrics.get("loss", float("nan"))}
