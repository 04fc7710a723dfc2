import math

import numpy as np
import pytest

from rose.errors import RewardError
from rose.ops.reward import apply_reward, as_reward
from rose.runtime.trajectory import Trajectory, to_batch


def _batch(n=3, failed=()):
    trajs = []
    for i in range(n):
        t = Trajectory(1, 0, i, "guess", 9, env_reward=float(i))
        t.add_context([1])
        if i in failed:
            t.finish_reason, t.error = "failed", "boom"
        trajs.append(t)
    return to_batch(trajs)


def test_default_reward_is_env_reward_and_failed_rows_stay_nan():
    out = apply_reward(_batch(3, failed=(1,)))
    r = out.column("reward").to_pylist()
    assert r[0] == 0.0 and r[2] == 2.0 and math.isnan(r[1])


def test_reward_function_sees_only_finished_rows():
    seen = []

    def fn(batch):
        seen.append(batch.column("trajectory_id").to_pylist())
        return [1.0] * batch.num_rows

    apply_reward(_batch(3, failed=(0,)), fn)
    assert seen == [["s1-g0-i1", "s1-g0-i2"]]


def _rows(batch):
    return {r["trajectory_id"]: r for r in batch.to_pylist()}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e39, 10**400, "x", None, [1.0]])
def test_an_unusable_reward_fails_that_trajectory_only_naming_the_function_and_trajectory(bad):
    # 1e39 is finite as a float64 but inf in the float32 reward column; 10**400 has no float at all.
    def broken_judge(batch):
        return [0.5, bad, 2]

    out = _rows(apply_reward(_batch(3), broken_judge))
    bad_row = out["s1-g0-i1"]
    assert bad_row["finish_reason"] == "failed" and math.isnan(bad_row["reward"])
    assert "RewardError" in bad_row["error"] and "'broken_judge'" in bad_row["error"]
    assert "s1-g0-i1" in bad_row["error"] and "finite" in bad_row["error"]
    # the rest of the batch is scored and kept
    assert out["s1-g0-i0"]["reward"] == 0.5 and out["s1-g0-i2"]["reward"] == 2.0
    assert out["s1-g0-i0"]["finish_reason"] == "done" and out["s1-g0-i0"]["error"] is None


def test_numpy_and_bool_rewards_are_numbers():
    import numpy as np

    out = apply_reward(_batch(3), lambda b: np.array([0.25, 1, -2], dtype=np.float64))
    assert out.column("reward").to_pylist() == [0.25, 1.0, -2.0]
    assert apply_reward(_batch(2), lambda b: [True, False]).column("reward").to_pylist() == [1.0, 0.0]


@pytest.mark.parametrize("fn, words", [
    (lambda b: [1.0], "returned 1 values for 2 trajectories"),
    (lambda b: 3.0, "raised TypeError"),  # not a sequence
    (lambda b: 1 / 0, "raised ZeroDivisionError: division by zero"),
])
def test_a_function_that_raises_or_miscounts_fails_the_rows_it_was_given_not_the_step(fn, words):
    out = _rows(apply_reward(_batch(3, failed=(0,)), fn))
    assert out["s1-g0-i0"]["error"] == "boom"  # already failed: untouched, not scored
    for tid in ("s1-g0-i1", "s1-g0-i2"):
        assert out[tid]["finish_reason"] == "failed" and math.isnan(out[tid]["reward"])
        assert words in out[tid]["error"] and tid in out[tid]["error"] and "reward_fn='<lambda>'" in out[tid]["error"]


def test_a_chained_reward_does_not_score_rows_an_earlier_one_failed():
    seen = []

    def second(batch):
        seen.append(batch.column("trajectory_id").to_pylist())
        return [1.0] * batch.num_rows

    first = apply_reward(_batch(3), lambda b: [0.0, float("nan"), 0.0])
    out = apply_reward(first, second)
    assert seen == [["s1-g0-i0", "s1-g0-i2"]]
    assert out.column("finish_reason").to_pylist() == ["done", "failed", "done"]


def test_what_the_trainer_trains_on_has_no_nan_reward():
    # The trainer keeps rows whose finish_reason is not "failed" (rose/runtime/trainer.py): every
    # reward left there must be finite, whatever the reward function did.
    import pyarrow.compute as pc

    fns = [lambda b: [float("nan")] * b.num_rows, lambda b: [1.0, float("inf"), "x", None, 2.0],
           lambda b: 1 / 0, lambda b: [1.0]]
    for fn in fns:
        out = apply_reward(_batch(5, failed=(4,)), fn)
        kept = out.filter(pc.not_equal(out.column("finish_reason"), "failed"))
        assert all(math.isfinite(r) for r in kept.column("reward").to_pylist())


def test_reward_error_pickles_with_context():
    import pickle

    e = RewardError("bad", trajectory_id="s1-g0-i1")
    e2 = pickle.loads(pickle.dumps(e))
    assert e2.context == {"trajectory_id": "s1-g0-i1"} and "s1-g0-i1" in str(e2)


@pytest.mark.parametrize("value, expected", [
    (0.1, float(np.float32(0.1))), (-7, -7.0), (True, 1.0), (np.float64(2.5), 2.5), (3.3e38, float(np.float32(3.3e38))),
    (-3.3e38, float(np.float32(-3.3e38))), (3.5e38, None), (1e39, None), (-10**39, None), (10**400, None),
    (float("nan"), None), (float("-inf"), None), ("1", None), (None, None)])
def test_as_reward_is_the_float32_value_or_none(value, expected):
    assert as_reward(value) == expected
