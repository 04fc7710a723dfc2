"""`rose.run`: drive a pipeline's RL steps on a cluster and return a `Report`.

Per step: build the step graph, validate it (before any worker does work), lower it to Dask tasks,
submit, and wait in phases (rollout, train, sync) so each phase is timed. Synchronous mode: step
k's rollouts all use weights version k, because step k-1's sync finished before they were submitted.
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

STEP_COLUMNS = ["step", "weight_version", "reward_mean", "reward_std", "trajectories", "failed", "tokens",
                "rollout_s", "train_s", "trainer_compute_s", "sync_s", "rollout_tok_s", "logprob_mismatch", "loss",
                "sync_bytes", "sync_refetches"]


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
        progress: bool = True, on_step: Callable[[dict], None] | None = None) -> Report:
    """Run `steps` RL steps of `pipeline` and return a Report.

    `cluster`: None (start a LocalRoseCluster for this run), a LocalRoseCluster or any Dask cluster
    object, a `distributed.Client`, or a scheduler address ("tcp://host:8786").

        report = rose.run("pipelines/guess.py", steps=20)
        report.metrics        # pandas DataFrame, one row per step
        report.plot("reward.png")
    """
    if isinstance(pipeline, str):
        pipeline = load_pipeline(pipeline)
    if seed is not None:
        pipeline = replace(pipeline, seed=seed)
    steps = pipeline.steps if steps is None else steps
    if steps < 1:
        raise ConfigError(f"steps={steps} must be >= 1")
    pipeline.build(0).validate()  # malformed graphs fail here, before any cluster work

    from rose.models import prepare_model

    # The warm start does not depend on the run seed: every seed starts from the same cached model.
    model_dir = prepare_model(pipeline.model, pipeline.env, progress=progress)
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
    for step in bar:
        try:
            row, table, ids = _run_step(pipeline, client, fleet, step, version)
        except Exception as e:
            # Keep what the finished steps produced: the caller (and `rose run`) can save it.
            err = RunError(f"step {step} failed: {type(e).__name__}: {e}", step=step, weight_version=version)
            err.report = report()
            raise err from e
        expected |= ids
        version = row["weight_version"]
        tables.append(table)
        seen.update(table["trajectory_id"].to_pylist())
        rows.append(row)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", failed=row["failed"])
        if on_step:
            on_step(row)
    return report()


def _wait_rollouts(futures, fleet: Fleet, version: int, poll_s: float = 0.5) -> None:
    """Wait for a step's rollouts; meanwhile let workers that connect join the run."""
    while True:
        try:
            wait(futures, timeout=poll_s)
            return
        except TimeoutError:
            fleet.poll(version)


def _run_step(pipeline, client, fleet: Fleet, step, version):
    """One synchronous RL step; returns (metrics row, trajectory table, trajectory ids asked for)."""
    fleet.settle(version)
    if not fleet.ready and not fleet.joining:
        raise RunError("no rollout worker is left in the run", step=step)
    graph = pipeline.build(step)
    ctx = LowerContext(step, version, graph.name, tuple(fleet.ready), pipeline.seed,
                       pipeline.engine.temperature, pipeline.engine.top_p)
    lowered = lower(graph, ctx)
    rollout, reward, train, sync = (_one_node(graph, op) for op in ("rollout", "reward", "train", "sync"))
    ids = {s.trajectory_id for s in lowered.outputs[(rollout.inputs["specs"].node, "specs")]}
    # Without the placement plugin, rollouts may go to any rollout worker (Dask decides).
    roles = dict(fleet.roles)  # as of the poll that began this step
    roles["rollout"] = sorted(a for r in ROLLOUT_ROLES for a in roles.get(r, []))
    futures = submit(client, lowered.tasks, roles)
    try:
        t_step = time.perf_counter()
        _wait_rollouts([futures[k] for k in lowered.keys_of(rollout.name, "trajectories")], fleet, version)
        rollout_s = time.perf_counter() - t_step
        batches = client.gather([futures[k] for k in lowered.keys_of(reward.name, "trajectories")])
        metrics = client.gather(futures[lowered.keys_of(train.name, "metrics")[0]])
        train_s = time.perf_counter() - t_step - rollout_s
        syncs = client.gather([futures[k] for k in lowered.keys_of(sync.name, "status")])
        sync_s = time.perf_counter() - t_step - rollout_s - train_s
    finally:
        for f in futures.values():
            f.release()
    statuses = [s for sync_result in syncs for s in sync_result["statuses"]]
    fleet.synced_to(statuses)
    new_versions = {s["weight_version"] for s in statuses}
    if new_versions != {metrics["weight_version"]}:
        raise RunError(f"engines hold weight versions {sorted(new_versions)} after sync, the trainer "
                       f"{metrics['weight_version']}", step=step)
    table = concat(batches)
    row = _step_row(step, metrics["weight_version"], table, metrics, rollout_s, train_s, sync_s)
    row["sync_bytes"] = sum(s.get("sent_bytes", 0) for s in syncs)
    row["sync_refetches"] = sum(s.get("refetches", 0) for s in syncs)
    return row, table, ids


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
