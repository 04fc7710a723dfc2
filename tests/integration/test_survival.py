"""A run survives what clusters do to it: its only rollout worker killed mid-run (the nanny restarts it),
or its engine made unusable by a weight load that failed inside vLLM (the worker restarts itself)."""
import logging
import os
import signal
import time

import pytest

import rose
from rose.config import ClusterConfig
from tests.helpers.faults import die_on_prepare, fail_next_load
from tests.integration.helpers import FP32, small_pipeline

pytestmark = pytest.mark.integration


def test_a_run_survives_its_only_rollout_worker_killed_mid_run():
    from distributed import Client

    from rose.fleet import roles_of
    from rose.runtime.cluster import LocalRoseCluster

    p = small_pipeline("guess", groups=4, group_size=4, steps=4)
    with LocalRoseCluster(ClusterConfig(num_dedicated=1), FP32) as cluster, Client(cluster) as client:
        (victim,) = roles_of(client)["dedicated"]
        pid = client.run(os.getpid, workers=[victim])[victim]
        killed = []

        def on_step(row):
            if row["step"] == 0:  # SIGKILL, as the kernel's OOM killer would: no goodbye to the scheduler
                os.kill(pid, signal.SIGKILL)
                killed.append(row["step"])
                # Step 1 starts once the scheduler has dropped the worker and before the nanny's new one
                # is up (seconds: a new process, then vLLM's imports): it finds no rollout worker at all.
                deadline = time.monotonic() + 30
                while victim in client.scheduler_info(n_workers=-1)["workers"] and time.monotonic() < deadline:
                    time.sleep(0.05)

        report = rose.run(p, cluster=client, on_step=on_step, progress=False)
        (replacement,) = roles_of(client)["dedicated"]
    assert killed == [0]
    assert report.metrics["step"].tolist() == [0, 1, 2, 3]
    assert report.lost == 0 and report.duplicated == 0 and report.summary["failed"] == 0
    assert report.workers_lost == 1 and report.metrics["workers_lost"].sum() == 1
    assert replacement != victim
    later = report.trajectories.filter(rose_step_at_least(report.trajectories, 2))
    assert set(later["worker"].to_pylist()) == {replacement}  # the nanny's new worker ran the later rollouts
    # every version the trainer made reached the engines: the last steps ran on the versions before them
    assert report.metrics["rollout_version"].tolist()[-1] == 3


def test_a_run_goes_on_when_a_rollout_worker_dies_while_it_builds_its_engine():
    """Its preparation, pinned to the dead worker, would wait forever: the run goes on with the others,
    and the nanny's new worker joins it."""
    from distributed import Client

    from rose.fleet import roles_of
    from rose.runtime.cluster import LocalRoseCluster

    p = small_pipeline("guess", groups=2, group_size=4, steps=3)
    with LocalRoseCluster(ClusterConfig(num_dedicated=2), FP32) as cluster, Client(cluster) as client:
        victim, other = roles_of(client)["dedicated"]
        client.run(die_on_prepare, workers=[victim])
        report = rose.run(p, cluster=client, progress=False)
    assert report.metrics["step"].tolist() == [0, 1, 2]
    assert report.lost == 0 and report.duplicated == 0 and report.summary["failed"] == 0
    assert report.workers_lost == 1
    assert victim not in set(report.trajectories["worker"].to_pylist())


def test_a_run_survives_a_weight_load_that_fails_inside_its_only_rollout_engine():
    """The sync after step 1 fails to load into the engine (a wrong-shaped tensor, part way through vLLM's
    load): the sync leaves that worker out, the worker restarts itself, and the nanny's new process joins,
    builds a new engine, catches up and runs the later rollouts."""
    from distributed import Client

    from rose.fleet import roles_of
    from rose.runtime.cluster import LocalRoseCluster

    p = small_pipeline("guess", groups=4, group_size=4, steps=4)
    with LocalRoseCluster(ClusterConfig(num_dedicated=1), FP32) as cluster, Client(cluster) as client:
        (victim,) = roles_of(client)["dedicated"]
        armed = []

        def on_step(row):
            if row["step"] == 0:  # step 0's sync is done: the next load into the engine is step 1's version
                armed.append(client.run(fail_next_load, workers=[victim])[victim])

        report = rose.run(p, cluster=client, on_step=on_step, progress=False)
        (replacement,) = roles_of(client)["dedicated"]
    assert armed == [True]
    assert report.metrics["step"].tolist() == [0, 1, 2, 3]
    assert report.lost == 0 and report.duplicated == 0 and report.summary["failed"] == 0
    assert report.workers_lost == 1 and replacement != victim
    later = report.trajectories.filter(rose_step_at_least(report.trajectories, 2))
    assert set(later["worker"].to_pylist()) == {replacement}
    assert report.metrics["rollout_version"].tolist()[-1] == 3


def test_a_serving_worker_whose_rollout_engine_failed_a_load_serves_on_and_the_run_goes_on_without_it(caplog):
    """The same failed load on a serving worker's rollout engine: the worker is not restarted (that would
    cut its online traffic). The sync leaves it out, the run does not take it back, and it still serves."""
    import asyncio

    import aiohttp
    from distributed import Client

    from rose.envs import env_class
    from rose.fleet import roles_of, scheduler_workers
    from rose.models import prepare_model
    from rose.runtime.cluster import LocalRoseCluster

    caplog.set_level(logging.INFO, logger="rose.run")
    model_dir = prepare_model(rose.ModelConfig(), env_class("guess"), progress=False)
    cfg = ClusterConfig(num_dedicated=1, num_serving=1, serving_model=model_dir, serving_tpot_ms=200.0)
    p = small_pipeline("guess", groups=4, group_size=4, steps=4)
    with LocalRoseCluster(cfg, FP32) as cluster, Client(cluster) as client:
        roles = roles_of(client)
        (serving,), (dedicated,) = roles["serving"], roles["dedicated"]

        def on_step(row):
            if row["step"] == 0:
                client.run(fail_next_load, workers=[serving])

        report = rose.run(p, cluster=client, on_step=on_step, progress=False)
        assert roles_of(client)["serving"] == [serving]  # still connected: the same process
        port = scheduler_workers(client)[serving]["metrics"]["rose"]["http_port"]

        async def ask():
            async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
                async with http.post("/v1/completions", json={"prompt": "guess", "max_tokens": 4}) as r:
                    return r.status, await r.json()

        status, body = asyncio.run(ask())
    assert status == 200 and body["usage"]["completion_tokens"] > 0
    assert report.metrics["step"].tolist() == [0, 1, 2, 3]
    assert report.lost == 0 and report.duplicated == 0 and report.summary["failed"] == 0
    assert report.workers_lost == 1
    assert not [r.message for r in caplog.records if "connected mid-run" in r.message]  # not taken back
    later = report.trajectories.filter(rose_step_at_least(report.trajectories, 2))
    assert set(later["worker"].to_pylist()) == {dedicated}
    assert report.metrics["rollout_version"].tolist()[-1] == 3


def rose_step_at_least(table, step):
    import pyarrow.compute as pc

    return pc.greater_equal(table["step"], step)


def test_the_driver_never_sees_a_worker_vanish_that_is_still_connected():
    """Client.scheduler_info() reads a cache the client's periodic update blanks (workers: {}); with
    the update every 5 ms it returned no workers in 42 of 2,000 reads here. A run takes that for every
    worker leaving. What the fleet reads asks the scheduler itself."""
    import dask
    from distributed import Client, LocalCluster

    from rose.fleet import scheduler_workers

    with dask.config.set({"distributed.client.scheduler-info-interval": "5ms"}), \
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as c, Client(c) as client:
        client.wait_for_workers(2)
        assert [len(scheduler_workers(client)) for _ in range(2000)] == [2] * 2000


def test_a_run_error_from_preparing_workers_carries_the_report(cluster, monkeypatch):
    """Every RunError out of rose.run holds the report of the steps that finished (none here), also one
    raised while workers are prepared (after a trainer restart, say: no trainer came back in time)."""
    from rose.errors import RunError
    from rose.run_state import RunState

    def no_trainer(self, spec, ckpt, gone):
        raise RunError("no trainer worker connected in 0 s")

    monkeypatch.setattr(RunState, "prepare", no_trainer)
    with pytest.raises(RunError, match="no trainer worker") as e:
        rose.run(small_pipeline("guess", groups=2, group_size=2, steps=1), cluster=cluster, progress=False)
    assert e.value.report is not None and len(e.value.report.metrics) == 0 and e.value.report.lost == 0
