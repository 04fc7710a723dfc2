"""Bad inputs on a real cluster (Dask processes, vLLM engines): each costs its own trajectory, recorded
with the reason, and nothing else. One small run covers an environment that raises, one that hangs,
a prompt longer than the context and a reward function that returns NaN; a second check sends prompts
that do not fit straight to a real engine loop."""
import zlib

import pytest

import rose
from tests.helpers.envs import BadInputsEnv
from tests.integration.helpers import run_engine_helper, small_pipeline

pytestmark = pytest.mark.integration

GROUPS = 6  # with seed 0, step 0: groups 0 and 2 hang, 1 and 3 play, 4 opens too long, 5 raises


def test_bad_envs_and_rewards_fail_their_own_trajectories_and_the_step_trains_on_the_rest(cluster):
    from tests.helpers.rewards import nan_for_sample_one

    env = "tests.helpers.envs:BadInputsEnv"
    p = small_pipeline(env, model_env="guess", groups=GROUPS, group_size=2, steps=1, reward_fn=nan_for_sample_one,
                       engine=rose.EngineConfig(dtype="float32", env_timeout_s=5.0))
    report = rose.run(p, cluster=cluster, progress=False)
    rows = report.trajectories.to_pylist()
    kind = {g: BadInputsEnv.kind(zlib.crc32(f"{p.seed}/0/{g}".encode())) for g in range(GROUPS)}
    assert set(kind.values()) == {"ok", "raises", "hangs", "long_prompt"}, kind
    assert len(rows) == 2 * GROUPS and report.lost == 0 and report.duplicated == 0
    for r in rows:
        tid, err, k = r["trajectory_id"], r["error"] or "", kind[r["group_id"]]
        where = f"trajectory_id='{tid}'"
        if k == "raises":
            assert r["finish_reason"] == "failed" and where in err
            assert f"environment '{env}' step at turn 0 raised RuntimeError: environment exploded on purpose" in err
        elif k == "hangs":
            assert r["finish_reason"] == "failed" and where in err
            assert f"environment '{env}' step at turn 0 did not return within env_timeout_s=5 s" in err
        elif k == "long_prompt":
            assert r["finish_reason"] == "failed" and where in err
            assert "PromptTooLongError: prompt of" in err and "(max_model_len=128)" in err
        elif r["sample_id"] == 1:  # the reward function's NaN
            assert r["finish_reason"] == "failed" and where in err
            assert f"reward function 'nan_for_sample_one' returned nan for trajectory {tid}" in err
        else:
            assert r["finish_reason"] != "failed" and r["error"] is None and r["reward"] == r["reward"]
    failed = sum(r["finish_reason"] == "failed" for r in rows)
    assert report.summary["failed"] == failed == 2 * GROUPS - 2
    assert report.metrics["weight_version"].tolist() == [1]  # the step trained on the two that finished
    # the engines and workers are unharmed: a normal run right after has no failure
    ok = rose.run(small_pipeline("guess", groups=1, group_size=2, steps=1), cluster=cluster, progress=False)
    assert ok.summary["failed"] == 0


def test_a_real_engine_refuses_prompts_that_do_not_fit_and_serves_the_others():
    seen = run_engine_helper("long_prompt_check.py")
    for k, n in (("over", 179), ("exact", 128)):
        assert not seen[k]["ok"] and seen[k]["error"].startswith(
            f"PromptTooLongError: prompt of {n} tokens leaves no room in max_model_len=128"), seen[k]
    assert seen["one_left"] == {"ok": True, "tokens": 1, "finish_reason": "length"}  # capped to the room left
    assert seen["good"]["ok"] and seen["good"]["tokens"] == 16 and seen["after"]["ok"]
