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

import dataclasses
import logging
import os
import shutil
import tempfile
from typing import Callable

from distributed import Client

from rose.checkpoint import RunDir
from rose.errors import ConfigError, RunError
from rose.fleet import TrainerLost, roles_of
from rose.ops.reward_model import needs_reward_worker
from rose.pipeline import Pipeline, load_pipeline, overridden, past_the_decay
from rose.report import Report
from rose.run_state import RunState
from rose.runtime.protocol import ModelSpec, rollout_addresses
from rose.schedule import plan_run
from rose.tracking import Tracking

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
        checkpoint_every: int | None = None, algorithm: str | None = None, track=None,
        verbose: bool = False) -> Report:
    """Run `steps` RL steps of `pipeline` and return a Report.

    `cluster`: None (start a LocalRoseCluster for this run), a LocalRoseCluster or any Dask cluster
    object, a `distributed.Client`, or a scheduler address ("tcp://host:8786"). `staleness` overrides
    the pipeline's (0: synchronous, 1: the next step's rollouts overlap this step's training).
    `out`: the run directory: the report (metrics.csv, trajectories.parquet, ...) is written there at
    every checkpoint and at the end, the checkpoints under `out/checkpoints` (None: checkpoints go to
    a temporary directory, removed after the run; they serve only to replace a lost trainer).
    `resume`: a run directory to continue from its latest checkpoint, up to `steps` steps in all
    (metrics and trajectories append; `out` defaults to it). `algorithm`: "grpo" or "dapo" for every
    train node of the pipeline (None: as the pipeline says). `track`: "tensorboard", "mlflow", "wandb"
    or a list of them: each step's scalars and the run's settings go there too (`rose.tracking`).
    `verbose`: the workers of the cluster this call starts print vLLM's and torch's messages to this
    console; by default they go to `out/logs/WORKER.log` (a kept temporary folder without `out`), and
    the console shows the progress and ROSE's own warnings, the workers' included.

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
    first = pipeline.build(0)
    first.validate_step()  # malformed graphs fail here, before any cluster work
    for message in past_the_decay(first, steps):
        logger.warning(message)
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

    tracking = Tracking(track, pipeline, out or os.path.join("runs", pipeline.name))
    if tracking.trackers:
        on_step = _both(tracking.log, on_step)
    owned, ok = [], False
    try:
        if cluster is None:
            from rose.runtime.cluster import LocalRoseCluster

            logs = None if verbose else (os.path.join(out, "logs") if out else tempfile.mkdtemp(prefix="rose-logs-"))
            cluster = LocalRoseCluster(local_cluster_config(pipeline), pipeline.engine, log_dir=logs)
            owned.append(cluster)
            if logs:
                logger.info("workers write their output to %s", logs)
        if isinstance(cluster, Client):
            client = cluster
        else:
            client = Client(cluster)
            owned.insert(0, client)
        # ROSE's warnings on the workers (a reward function that failed, an environment that raised)
        # reach this process's "rose" loggers, whatever the workers do with their own output.
        client.forward_logging("rose", level=logging.WARNING)
        history = RunDir(resume).history(resume_from.step) if resume_from else ([], [])
        report = _run(pipeline, client, spec, steps, progress, on_step, run_dir, out is not None, resume_from,
                      history)
        ok = True
        return report
    finally:
        tracking.close(ok)
        for thing in owned:
            thing.close()
        if out is None:
            shutil.rmtree(run_dir.root, ignore_errors=True)


def local_cluster_config(pipeline: Pipeline):
    """The ClusterConfig of the LocalRoseCluster `rose.run` starts for `pipeline`: a synchronous run's
    rollouts and training take turns, so its trainer gets the rollout workers' cores too."""
    from rose.runtime.cluster import synchronous_cores

    return synchronous_cores(pipeline.cluster) if pipeline.staleness == 0 else pipeline.cluster


def _with_engine_dtype(client: Client, spec: ModelSpec, rollout: list[str]) -> ModelSpec:
    """`spec` with its engines' dtype decided once for the run where it says "auto": bfloat16 only where
    every rollout worker's device computes it natively. The trainer publishes weights in it and every
    engine loads them as they are, so no worker decides for itself."""
    if spec.engine.dtype != "auto":
        return spec
    from rose.runtime.engine.dtype import choose_dtype, native_bf16

    native = client.run(native_bf16, workers=rollout)
    dtype = choose_dtype("auto", native.values())
    logger.info("engine dtype auto: %s (bf16 native on %d of %d rollout workers)", dtype, sum(native.values()),
                len(native))
    return dataclasses.replace(spec, engine=dataclasses.replace(spec.engine, dtype=dtype))


def _both(first, then):
    def on_step(row):
        first(row)
        if then is not None:
            then(row)
    return on_step


def _run(pipeline, client, spec, steps, progress, on_step, run_dir, persist, ckpt, history) -> Report:
    from tqdm.auto import tqdm

    roles = roles_of(client)
    if not roles.get("trainer"):
        raise ConfigError(f"the cluster has no trainer worker (roles: {roles}); start one with "
                          "`dask worker ... --preload rose.worker --rose-role trainer`")
    if not rollout_addresses(roles):
        raise ConfigError(f"the cluster has no rollout worker (roles: {roles})")
    if not roles.get("reward") and any(n.op == "reward" and needs_reward_worker(n.params.get("fn"))
                                       for n in pipeline.build(0).nodes.values()):
        raise ConfigError(f"the pipeline scores with rose.RewardModel, and the cluster has no reward worker (roles: "
                          f"{roles}); start one with `dask worker ... --preload rose.worker --rose-role reward "
                          f"--rose-reward-model DIR`, or ClusterConfig(num_reward=1, reward_model=DIR)")
    placement = _check_placement(client)
    spec = _with_engine_dtype(client, spec, rollout_addresses(roles))
    rows, tables = history
    restarts, gone = 0, None
    redone: list[dict] = []  # rows of steps a trainer loss made the run do again
    run = None
    with tqdm(total=steps, initial=len(rows), desc=pipeline.name, disable=not progress, unit="step") as bar:
        while True:
            run = RunState(pipeline, client, steps, run_dir, persist, rows, tables, restarts, redone,
                           run.prepare_s if run else 0.0, early_sync=placement is not None)
            try:
                run.prepare(spec, ckpt, gone)
                # With the plugin, a rollout task waits in the scheduler for an engine at its weight version:
                # asynchronous steps can start while the sync bringing that version runs.
                for action in plan_run(steps, pipeline.staleness, first=len(rows),
                                       start_on_sync=placement is not None):
                    row = run.do(action)
                    if row is not None:
                        bar.update(1)
                        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", failed=row["failed"])
                        if on_step:
                            on_step(row)
            except TrainerLost as e:
                run.release()
                restarts, gone = restarts + 1, e.context.get("worker") or (run.fleet.trainer if run.fleet else None)
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
            except RunError as e:  # from preparing workers (a step's own carries the report already)
                if e.report is None:
                    e.report = run.report()
                raise
            if persist:
                run.report().save(run_dir.root)
            return run.report()
