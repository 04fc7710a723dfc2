import math

import pytest

from rose.errors import RewardError
from rose.ops.reward import apply_reward
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


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "x", None])
def test_non_finite_reward_names_the_trajectory(bad):
    def fn(batch):
        return [0.0, bad, 0.0]

    with pytest.raises(RewardError, match="s1-g0-i1"):
        apply_reward(_batch(3), fn)


def test_wrong_length_is_an_error():
    with pytest.raises(RewardError, match="returned 1 values for 3"):
        apply_reward(_batch(3), lambda b: [1.0])


def test_reward_error_pickles_with_context():
    import pickle

    e = RewardError("bad", trajectory_id="s1-g0-i1")
    e2 = pickle.loads(pickle.dumps(e))
    assert e2.context == {"trajectory_id": "s1-g0-i1"} and "s1-g0-i1" in str(e2)
