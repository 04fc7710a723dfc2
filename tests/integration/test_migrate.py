"""The tail moves off a serving worker (`ClusterConfig(migrate=True)`, the plugin's --rose-migrate): a
real cluster with one dedicated worker (8 slots) and one serving worker, real vLLM engines, rollouts
whose environment steps take 0.3 s. The dedicated worker is drained first, so the step's groups all
go to the serving worker; when it gets its slots back and nothing waits, the placement plugin moves
the oldest groups there, and they finish with nothing lost."""
from __future__ import annotations

import pytest

import rose
from rose.config import ClusterConfig, EngineConfig
from tests.integration.helpers import small_pipeline
from tests.integration.test_placement import plugin_state, run_in_background, wait_for

pytestmark = pytest.mark.integration

SLOW = "tests.helpers.envs:SlowEnv"


@pytest.fixture(scope="module")
def mixed_cluster():
    from distributed import Client

    from rose.envs import env_class
    from rose.models import prepare_model
    from rose.runtime.cluster import LocalRoseCluster

    model_dir = prepare_model(rose.ModelConfig(), env_class("guess"), progress=False)
    cfg = ClusterConfig(num_dedicated=1, num_serving=1, cores=(0, 1), serving_model=model_dir,
                        serving_tpot_ms=200.0, dedicated_slots=8, migrate=True)
    with LocalRoseCluster(cfg, EngineConfig(dtype="float32")) as c, Client(c) as client:
        yield client


def _requests_done(dask_worker) -> int:
    return dask_worker.plugins["rose"].host.engine.counters()["rollout_requests"]


def test_groups_on_a_serving_worker_move_to_a_dedicated_worker_with_room(mixed_cluster):
    client = mixed_cluster
    roles = {a: w["role"] for a, w in plugin_state(client)["workers"].items()}
    (d,) = [a for a, r in roles.items() if r == "dedicated"]
    (s,) = [a for a, r in roles.items() if r == "serving"]
    client.run(lambda dask_worker: dask_worker.plugins["rose"].set_slot_cap(0), workers=[d])
    wait_for(lambda: plugin_state(client)["workers"][d]["slots"] == 0, what="the drain reaching the scheduler")
    thread, box = run_in_background(client, small_pipeline(SLOW, model_env="guess", groups=4, group_size=4))
    wait_for(lambda: plugin_state(client)["workers"][s]["inflight"] == 4, what="every group on the serving worker")
    # A group shed before its first turn moves whole (nothing ran here): wait for a turn's worth of requests
    # (16) to finish on the serving engine, so the oldest groups, the ones moved, began here (on a loaded
    # host a group's first request can come after the drain ends).
    wait_for(lambda: client.run(_requests_done, workers=[s])[s] >= 16, what="a first turn on the serving worker")
    client.run(lambda dask_worker: dask_worker.plugins["rose"].set_slot_cap(None), workers=[d])
    thread.join(300)
    assert "error" not in box, box.get("error")
    report, state = box["report"], plugin_state(client)
    assert state["workers"][s]["migrated"] >= 1, [e for e in state["events"] if e[1] != "training"]
    assert state["workers"][d]["migrated"] == 0  # only serving workers give their tail away
    t = report.trajectories
    ids = t["trajectory_id"].to_pylist()
    assert len(ids) == len(set(ids)) == 16 and report.lost == 0 and report.duplicated == 0
    # A moved trajectory began on the serving worker and ended on the dedicated one, and did not go back.
    moved = [tw for tw in t["turn_workers"].to_pylist() if s in tw and d in tw]
    assert moved, t["turn_workers"].to_pylist()
    assert all(tw.index(d) > max(i for i, w in enumerate(tw) if w == s) for tw in moved)
    assert state["errors"] == 0, state["last_error"]
