"""A co-served device's offer is bounded by the trajectories it keeps moving, learnt while admissions bind."""
import pytest
from hypothesis import given, strategies as st

from rose.errors import ConfigError
from rose.runtime.coserve.backlog import OfferBound
from rose.runtime.coserve.executor import CoServingExecutor
from rose.runtime.coserve.slo import IterationPlan, SloConfig, SloController
from rose.runtime.engine import SamplingSpec
from rose.runtime.engine.fake import FakeEngine


def test_a_device_never_seen_saturated_offers_what_its_controller_offers():
    b = OfferBound()
    for _ in range(500):
        b.observe(in_flight=128, waiting=2, admitted=5)  # a short queue: it keeps up
    assert b.value is None and b.bound(128) == 128


def test_what_waits_beyond_a_short_queue_comes_off_the_offer():
    b = OfferBound(queue_iterations=3)
    for _ in range(2000):
        b.observe(in_flight=128, waiting=100, admitted=5)  # queue 15: 85 only wait
    assert b.value == pytest.approx(43, abs=0.5)
    assert b.bound(128) == 43 and b.bound(20) == 20  # a bound, never a raise


def test_the_bound_keeps_a_group_and_rises_when_the_device_keeps_up_with_all_it_may_hold():
    b = OfferBound(floor=8)
    for _ in range(2000):
        b.observe(in_flight=10, waiting=60, admitted=1)
    assert b.bound(128) == 8  # never below one group
    b = OfferBound(floor=8)
    for _ in range(2000):
        b.observe(in_flight=128, waiting=100, admitted=5)
    learnt = b.value
    for _ in range(50):
        b.observe(in_flight=16, waiting=0, admitted=2)  # far under the bound: says nothing
    assert b.value == learnt
    for _ in range(50):  # given what the bound allows (whole groups of 8), and keeping up with it
        b.observe(in_flight=b.bound(128) // 8 * 8, waiting=0, admitted=2)
    assert b.value > 1.5 * learnt


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300), st.integers(0, 20)), max_size=300),
       st.integers(1, 256))
def test_the_bound_never_raises_an_offer_nor_takes_it_under_the_floor(obs, offer):
    b = OfferBound(floor=8)
    for in_flight, waiting, admitted in obs:
        b.observe(in_flight, waiting, admitted)
        assert b.bound(offer) <= offer
        assert b.bound(offer) >= min(offer, 8)


@pytest.mark.parametrize("field,value", [("queue_iterations", 0), ("decay", 1.0), ("growth", -0.1), ("floor", 0)])
def test_bad_settings_are_named(field, value):
    with pytest.raises(ConfigError, match=field):
        OfferBound(**{field: value})


class OneAdmission(SloController):
    """Admits one waiting rollout request an iteration, whatever the budget says."""

    def __init__(self):
        super().__init__(SloConfig(ttft_ms=1000, tpot_ms=1000))

    def plan(self, serving, rollout):
        admit = tuple(r.request_id for r in rollout.waiting[:1])
        return IterationPlan(serving.decoding, 0.0, True, rollout_admit=admit,
                             rollout_tokens=len(rollout.running) + len(admit))


def test_an_executor_that_admits_slowly_offers_less_than_its_controller():
    ex = CoServingExecutor(FakeEngine(), FakeEngine(), OneAdmission())
    try:
        assert ex.rollout_capacity == ex.controller.caps.max_seqs  # nothing learnt yet
        futs = [ex.generate([1, 2, 3], SamplingSpec(max_tokens=40), request_id=f"r{i}") for i in range(48)]
        for f in futs:
            assert len(f.result(timeout=30).token_ids) == 40  # nothing lost to the bound
        assert ex.offer_bound.value is not None
        assert ex.rollout_capacity < ex.controller.caps.max_seqs
    finally:
        ex.close()
