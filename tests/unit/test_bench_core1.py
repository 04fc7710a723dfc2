"""elastic_e2e's split of core 1's timed window into engine steps and its worker's CPU: pure arithmetic on
two readings."""
import pytest

from benchmarks.elastic_e2e import core1_steps


def test_core_1s_window_splits_into_its_workers_rollout_and_serving_steps():
    first = {"serving": {"rollout": 1.0, "serving": 2.0, "cpu": 10.0},
             "dedicated": {"rollout": 5.0, "serving": 0.0, "cpu": 7.0}, "trainer": None}
    last = {"serving": {"rollout": 5.0, "serving": 4.0, "cpu": 19.0},
            "dedicated": {"rollout": 9.0, "serving": 0.0, "cpu": 8.0},
            "trainer": None, "elastic-0": {"rollout": 1.0, "serving": 0.0, "cpu": 3.0}}
    # only core 1's workers count; the window is 10 s
    assert core1_steps(first, last, {"serving"}, 10.0) == pytest.approx(
        {"core1_rollout_share": 0.4, "core1_serving_share": 0.2, "core1_cpu_share": 0.9})
    # a worker that joined during the window counts from zero; one with no rollout engine counts nothing
    assert core1_steps(first, last, {"elastic-0", "trainer"}, 10.0) == pytest.approx(
        {"core1_rollout_share": 0.1, "core1_serving_share": 0.0, "core1_cpu_share": 0.3})
