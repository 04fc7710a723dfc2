"""The TPOT margin follows how far measured periods overshoot the controller's predictions."""
import numpy as np
import pytest

from rose.errors import ConfigError
from rose.runtime.coserve.margin import MarginLearner
from rose.runtime.coserve.slo import ServingView, RolloutSeq, RolloutView, SloConfig, SloController


def feed(learner, missed_ms, predicted=20.0):
    for m in missed_ms:
        learner.observe(predicted, predicted + m)


def test_the_prior_holds_until_enough_periods_are_measured():
    m = MarginLearner(100.0, 0.05, 0.15, 0.4, window=16, min_windows=200)
    feed(m, np.zeros(200))  # 185 windows: not enough
    assert m.margin == 0.15
    feed(m, np.zeros(100))
    assert m.margin == 0.05  # exact predictions: the floor


def test_the_margin_covers_the_windowed_overshoot_and_stays_within_its_bounds():
    rng = np.random.default_rng(0)
    m = MarginLearner(100.0, 0.0, 0.15, 0.5, window=16)
    feed(m, rng.normal(10.0, 1.0, 2000))  # periods 10 ms (a tenth of the budget) over their prediction
    assert m.margin == pytest.approx(0.10, abs=0.015)
    busy = MarginLearner(100.0, 0.05, 0.15, 0.4, window=16)
    feed(busy, np.full(2000, 25.0))
    assert busy.margin == pytest.approx(0.25)  # a busy host keeps more than the prior
    hi = MarginLearner(100.0, 0.05, 0.15, 0.4, window=16)
    feed(hi, np.full(2000, 60.0))
    assert hi.margin == 0.4  # and no more than the ceiling
    short = MarginLearner(100.0, 0.0, 0.15, 0.5, window=16)
    for _ in range(2000):
        short.observe(2.0, 5.0)  # short periods 150 % over: 3 ms of a 100 ms budget
    assert short.margin == pytest.approx(0.03)


def test_a_stall_is_covered_for_the_requests_decoding_through_it_and_then_forgotten():
    def learner(q):
        m = MarginLearner(100.0, 0.0, 0.15, 0.5, window=8, history=1024, quantile=q)
        feed(m, np.zeros(1500))
        feed(m, [40.0])  # one iteration stalls 40 ms: the 8 windows that hold it miss by 5 ms (0.8 %)
        feed(m, np.zeros(100))
        return m
    m = learner(99.9)
    assert m.margin == pytest.approx(0.05)
    feed(m, np.zeros(1100))  # a thousand windows later it has aged out
    assert m.margin == 0.0
    assert learner(99.0).margin == 0.0  # the 99th percentile would not have covered it at all


def test_a_learnt_margin_widens_the_rollout_budget_and_a_fixed_one_does_not():
    serving = ServingView(decoding=8)
    rollout = RolloutView(running=(RolloutSeq("r", 10),))
    for learn, widens in ((True, True), (False, False)):
        ctl = SloController(SloConfig(ttft_ms=500, tpot_ms=100, margin=0.15, margin_min=0.02, learn_margin=learn))
        before = ctl.plan(serving, rollout).budget_ms
        for _ in range(400):
            ctl.observe_iteration(30.0, 25.0, 5.0, 30.0)
        after = ctl.plan(serving, rollout).budget_ms
        assert (after > before) == widens
        assert after == pytest.approx(before + (0.15 - ctl.margin) * 100)


def test_bad_margin_bounds_are_named_and_the_bounds_always_hold_the_prior():
    learner = SloController(SloConfig(ttft_ms=500, tpot_ms=100, margin=0.0, learn_margin=True)).margin_learner
    assert (learner.floor, learner.margin, learner.ceiling) == (0.0, 0.0, 0.4)
    fixed = SloController(SloConfig(ttft_ms=500, tpot_ms=100, learn_margin=False)).margin_learner
    assert (fixed.floor, fixed.margin, fixed.ceiling) == (0.15, 0.15, 0.15)
    with pytest.raises(ConfigError, match="margin_min"):
        SloConfig(ttft_ms=500, tpot_ms=100, margin_min=-0.1)
    with pytest.raises(ConfigError, match="margin_max"):
        SloConfig(ttft_ms=500, tpot_ms=100, margin_max=1.0)
    with pytest.raises(ConfigError, match="margin_window"):
        SloConfig(ttft_ms=500, tpot_ms=100, margin_window=0)


def test_a_serving_worker_learns_its_margin_unless_started_with_a_fixed_one():
    from rose.worker import dask_setup
    ctx = dask_setup.make_context("dask_setup", ["--rose-role", "serving", "--rose-learn-margin"])
    assert ctx.params["rose_learn_margin"] is True
    assert dask_setup.make_context("dask_setup", ["--rose-role", "serving"]).params["rose_learn_margin"] is True
    fixed = dask_setup.make_context("dask_setup", ["--rose-role", "serving", "--rose-fixed-margin"])
    assert fixed.params["rose_learn_margin"] is False
