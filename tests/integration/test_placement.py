"""The placement plugin on a real cluster: scheduler, trainer and two dedicated workers as processes,
real vLLM engines. Rollouts use an environment whose steps take 0.3 s, so tasks are in flight when
a worker's capacity drops or the worker dies."""
from __future__ import annotations

import logging
import os
import threading
import time

import pytest

import rose
from rose.config import ClusterConfig, EngineConfig
from tests.integration.helpers import small_pipeline

SLOW = "tests.helpers.envs:SlowEnv"


def plugin_state(client) -> dict:
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["rose"].state())


def wait_for(pred, timeout=120.0, what="condition"):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def two_workers():
    from distributed import Client

    from rose.runtime.cluster import LocalRoseCluster

    logging.getLogger("distributed").setLevel(logging.WARNING)
    # dedicated-0 shares core 0 with the trainer (so it starts --rose-colocated); dedicated-1 has core 1
    cfg = ClusterConfig(num_dedicated=2, cores=(0, 1), trainer_cores=(0,))
    with LocalRoseCluster(cfg, EngineConfig()) as c, Client(c) as client:
        yield client


def run_in_background(client, pipeline, steps=1):
    box = {}

    def go():
        try:
            box["report"] = rose.run(pipeline, cluster=client, steps=steps, progress=False)
        except BaseException as e:  # surfaced by the test
            box["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, box


def dedicated(client) -> list[str]:
    return sorted(a for a, w in plugin_state(client)["workers"].items() if w["role"] == "dedicated")


def check_complete(report, n):
    t = report.trajectories
    ids = t["trajectory_id"].to_pylist()
    assert len(ids) == n and len(set(ids)) == n
    assert report.lost == 0 and report.duplicated == 0
    assert set(t["finish_reason"].to_pylist()) <= {"done", "max_turns", "length"}, t["error"].to_pylist()


def test_capacity_drop_stops_dispatch_and_shed_rollouts_finish_elsewhere(two_workers):
    client = two_workers
    pipeline = small_pipeline(SLOW, model_env="guess", groups=8, group_size=4)
    thread, box = run_in_background(client, pipeline)
    # Both workers run rollouts of the step...
    wait_for(lambda: len(dedicated(client)) == 2 and all(
        plugin_state(client)["workers"][a]["inflight"] > 0 for a in dedicated(client)), what="rollouts on both")
    a, b = dedicated(client)
    # ...then `a` drains: its capacity drops to 0.
    client.run(lambda dask_worker: dask_worker.plugins["rose"].set_slot_cap(0), workers=[a])
    wait_for(lambda: plugin_state(client)["workers"][a]["slots"] == 0, what="the drop reaching the scheduler")
    dispatched_a = plugin_state(client)["workers"][a]["dispatched"]
    thread.join(300)
    assert "error" not in box, box.get("error")
    report = box["report"]
    check_complete(report, 32)
    state = plugin_state(client)
    assert state["workers"][a]["dispatched"] == dispatched_a  # nothing new went to the drained worker
    assert state["workers"][a]["shed"] >= 1 and state["workers"][a]["inflight"] == 0
    # each group shed there gave its slots back as it stopped, before its trajectories ended on `b`
    assert 1 <= state["workers"][a]["yielded"] <= state["workers"][a]["shed"]
    # A shed trajectory names both workers: it began on `a` and ended on `b`.
    turn_workers = report.trajectories["turn_workers"].to_pylist()
    moved = [tw for tw in turn_workers if a in tw and b in tw]
    assert moved, turn_workers
    assert all(tw.index(b) > max(i for i, w in enumerate(tw) if w == a) for tw in moved)
    assert all(w == b for w in report.trajectories.filter(
        [a in tw and b in tw for tw in turn_workers])["worker"].to_pylist())
    assert state["errors"] == 0, state["last_error"]
    client.run(lambda dask_worker: dask_worker.plugins["rose"].set_slot_cap(None), workers=[a])


def test_asynchronous_steps_train_on_rollouts_one_version_behind(two_workers):
    """staleness=1: step k+1's rollouts run during step k's training on the weights before it; the
    worker colocated with the trainer yields while it trains; no trajectory mixes versions. Steps 2
    and 3 start while the sync bringing their weights runs (the plugin holds their rollouts until
    each engine has them): their tokens must still all come from those weights."""
    client = two_workers
    colocated = [a for a, w in plugin_state(client)["workers"].items() if w["colocated"]]
    assert len(colocated) == 1 and colocated[0] in dedicated(client)
    pipeline = small_pipeline("guess", groups=4, group_size=4, steps=4)
    report = rose.run(pipeline, cluster=client, steps=4, progress=False, staleness=1)
    check_complete(report, 64)
    m = report.metrics
    assert m["rollout_version"].tolist() == [0, 0, 1, 2] and m["weight_version"].tolist() == [1, 2, 3, 4]
    for row in report.trajectories.to_pylist():
        versions = {v for v, mask in zip(row["weight_versions"], row["loss_mask"]) if mask}
        assert versions == {max(0, row["step"] - 1)}, row["trajectory_id"]  # one version, one behind
    assert (m["logprob_mismatch"].iloc[1:] > 1e-4).all()  # the trainer had moved on: off-policy (TIS corrects)
    state = plugin_state(client)
    assert state["errors"] == 0, state["last_error"]
    assert sum(e[1] == "training" for e in state["events"]) >= 4 and state["training"] == []
    assert all(w["weight_version"] == 4 for a, w in state["workers"].items() if a in dedicated(client))


def test_an_asynchronous_steps_sync_stages_early_and_commits_only_after_the_next_steps_rollouts(two_workers):
    """With the plugin, step k's sync is submitted as step k+1 starts: it stages while k+1's rollouts run
    (here each turn waits 0.3 s, so they outlast step k's training) and commits on each engine once the
    scheduler reports it clear of them (none runs there, none can come back). A commit before then would
    swap weights under running trajectories."""
    client = two_workers
    before = plugin_state(client)["barrier"]
    pipeline = small_pipeline(SLOW, model_env="guess", groups=4, group_size=4, steps=4)
    report = rose.run(pipeline, cluster=client, steps=4, progress=False, staleness=1)
    check_complete(report, 64)
    assert report.metrics["rollout_version"].tolist() == [0, 0, 1, 2]
    for row in report.trajectories.to_pylist():
        versions = {v for v, mask in zip(row["weight_versions"], row["loss_mask"]) if mask}
        assert versions == {max(0, row["step"] - 1)}, row["trajectory_id"]
    after = plugin_state(client)["barrier"]
    # steps 0, 1 and 2 synced early, each receiver asking, and at least one had to wait for the next rollouts
    assert after["calls"] - before["calls"] == 3 * len(dedicated(client)) and after["waited"] - before["waited"] >= 1
    assert after["waits"] == 0 and plugin_state(client)["errors"] == 0


def test_killed_worker_rollouts_are_replaced_once(two_workers):
    client = two_workers
    pipeline = small_pipeline(SLOW, model_env="guess", groups=8, group_size=4, steps=2)
    thread, box = run_in_background(client, pipeline, steps=2)
    wait_for(lambda: len(dedicated(client)) == 2 and all(
        plugin_state(client)["workers"][x]["inflight"] > 0 for x in dedicated(client)), what="rollouts on both")
    victim = dedicated(client)[0]
    async def die():
        os._exit(1)

    client.run(die, workers=[victim], wait=False)
    thread.join(300)
    assert "error" not in box, box.get("error")
    report = box["report"]
    check_complete(report, 64)
    assert victim not in report.trajectories["worker"].unique().to_pylist()  # its rollouts ran again elsewhere
    state = plugin_state(client)
    assert state["errors"] == 0, state["last_error"]
    assert victim not in state["workers"]
    assert any(e[1] == "removed" and e[2] == victim for e in state["events"])


def test_elastic_policy_adds_a_worker_that_joins_mid_run():
    """Under the elastic baseline, waiting rollouts make the cluster scale up; the new worker arrives
    after its allocation delay, builds its engine, catches up on the weights and takes rollouts."""
    from distributed import Client

    from rose.runtime.cluster import LocalRoseCluster
    from rose.config import ElasticConfig

    cfg = ClusterConfig(num_dedicated=1, policy="elastic", dedicated_slots=8,
                        elastic=ElasticConfig(max_extra=1, worker_slots=12, allocation_delay_s=1.0,
                                              idle_release_s=600.0))
    pipeline = small_pipeline(SLOW, model_env="guess", groups=8, group_size=4, steps=4)
    with LocalRoseCluster(cfg, EngineConfig()) as c, Client(c) as client:
        def joined_by_step_1(row):
            # On a busy host the new worker's engine build can outlast the run: after step 1, a worker
            # that is joining gets time to finish (a prepared engine, caught up), so steps 2 and 3 run
            # with it.
            deadline = time.monotonic() + 300
            while row["step"] == 1 and time.monotonic() < deadline:
                elastic = [w for w in plugin_state(client)["workers"].values() if w["elastic"]]
                if not elastic or elastic[0]["weight_version"] >= 1:
                    return
                time.sleep(0.5)

        report = rose.run(pipeline, cluster=client, steps=4, progress=False, on_step=joined_by_step_1)
        state = plugin_state(client)
    check_complete(report, 128)
    elastic = [a for a, w in state["workers"].items() if w["elastic"]]
    assert len(elastic) == 1, state["workers"]
    assert state["workers"][elastic[0]]["slots"] == 12  # ElasticConfig.worker_slots, not dedicated_slots
    assert state["workers"][elastic[0]]["weight_version"] == 4  # caught up, then synced with the rest
    assert elastic[0] in report.trajectories["worker"].unique().to_pylist()  # it ran rollouts
    assert state["errors"] == 0, state["last_error"]
