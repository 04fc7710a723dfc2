"""The co-serving controller's decisions: pure, property-tested."""
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose.errors import ConfigError
from rose.runtime.coserve.slo import (
    LatencyModel,
    RolloutCaps,
    RolloutSeq,
    RolloutView,
    ServingView,
    SloConfig,
    SloController,
)


def _model(base, per_token):
    m = LatencyModel(base, per_token)
    for t in (1, 8, 64, 256):
        m.observe(t, base + per_token * t)
    return m


@st.composite
def situations(draw):
    serving = ServingView(
        decoding=draw(st.integers(0, 64)),
        waiting_prompt_tokens=tuple(draw(st.lists(st.integers(1, 2048), max_size=6))),
        oldest_wait_ms=draw(st.floats(0, 2000)),
        kv_free_tokens=draw(st.integers(0, 50_000)),
        kv_needed_tokens=draw(st.integers(0, 50_000)),
    )
    running = tuple(RolloutSeq(f"r{i}", draw(st.integers(1, 2000)), admitted_at=float(i))
                    for i in range(draw(st.integers(0, 40))))
    waiting = tuple(RolloutSeq(f"w{i}", draw(st.integers(1, 2000))) for i in range(draw(st.integers(0, 20))))
    rollout = RolloutView(running, waiting, kv_available_tokens=draw(st.integers(0, 60_000)))
    slo = SloConfig(ttft_ms=draw(st.floats(50, 5000)), tpot_ms=draw(st.floats(5, 200)))
    caps = RolloutCaps(max_seqs=draw(st.integers(0, 64)), max_kv_tokens=draw(st.integers(0, 40_000)))
    base, per = draw(st.floats(0.5, 20)), draw(st.floats(0.001, 0.5))
    ctl = SloController(slo, caps, serving_model=_model(base, per), rollout_model=_model(base, per))
    return ctl, serving, rollout


@settings(max_examples=300, deadline=None)
@given(situations())
def test_rollout_never_runs_over_the_budget_and_caps_hold(s):
    ctl, serving, rollout = s
    plan = ctl.plan(serving, rollout)
    if plan.rollout_step and (serving.decoding or serving.waiting_prompt_tokens):  # a TPOT to keep
        assert plan.rollout_ms <= plan.budget_ms  # predicted: within TPOT minus margin minus serving
        assert plan.budget_ms <= ctl.slo.tpot_ms * (1 - ctl.margin)
        # every step of the iteration, together, within the budget too
        more = (plan.rollout_steps - 1) * ctl.rollout_model.predict(len(rollout.running) - len(plan.rollout_preempt)
                                                                     + len(plan.rollout_admit))
        assert plan.rollout_ms + more <= plan.budget_ms + 1e-9
    assert 1 <= plan.rollout_steps <= ctl.slo.max_rollout_steps if plan.rollout_step else plan.rollout_steps == 0
    if not (serving.decoding or serving.waiting_prompt_tokens):  # no TPOT to keep: one step an iteration
        assert plan.rollout_steps <= 1
    # A request whose prompt this serving step does not prefill whole waits the period out only inside its guard.
    if (sum(serving.waiting_prompt_tokens) > ctl.prefill_chunk
            and serving.oldest_wait_ms + plan.budget_ms >= ctl.slo.ttft_guard * ctl.slo.ttft_ms):
        assert plan.rollout_steps <= 1
    running = ({r.request_id: r for r in rollout.running}.keys() - set(plan.rollout_preempt)) | set(plan.rollout_admit)
    kv = {r.request_id: r.kv_tokens for r in rollout.running + rollout.waiting}
    if plan.rollout_admit:  # caps bind whatever is admitted
        assert len(running) <= ctl.caps.max_seqs
        assert sum(kv[r] for r in running) <= min(ctl.caps.max_kv_tokens, rollout.kv_available_tokens)
    assert set(plan.rollout_preempt) <= {r.request_id for r in rollout.running}
    assert set(plan.rollout_admit) <= {r.request_id for r in rollout.waiting}


@settings(max_examples=200, deadline=None)
@given(situations(), situations())
def test_serving_is_planned_first_whatever_rollout_wants(a, b):
    ctl, serving, rollout = a
    _, _, other_rollout = b
    one, two = ctl.plan(serving, rollout), ctl.plan(serving, other_rollout)
    assert one.serving_tokens == two.serving_tokens == serving.decoding + min(sum(serving.waiting_prompt_tokens),
                                                                              ctl.prefill_chunk)


@settings(max_examples=200, deadline=None)
@given(situations())
def test_under_memory_pressure_rollout_is_preempted_and_nothing_admitted(s):
    ctl, serving, rollout = s
    short = serving.kv_needed_tokens - serving.kv_free_tokens
    plan = ctl.plan(serving, rollout)
    if short > 0:
        freed = sum(r.kv_tokens for r in rollout.running if r.request_id in plan.rollout_preempt)
        assert freed >= short or len(plan.rollout_preempt) == len(rollout.running)
        assert not plan.rollout_admit
        # newest first: every preempted sequence is newer than every kept one
        kept = [r.admitted_at for r in rollout.running if r.request_id not in plan.rollout_preempt]
        gone = [r.admitted_at for r in rollout.running if r.request_id in plan.rollout_preempt]
        assert not kept or not gone or max(kept) < min(gone)


def test_a_request_near_its_ttft_deadline_stops_rollout_steps():
    ctl = SloController(SloConfig(ttft_ms=200, tpot_ms=50))
    rollout = RolloutView((RolloutSeq("r0", 10),), (RolloutSeq("w0", 10),))
    calm = ctl.plan(ServingView(decoding=2, waiting_prompt_tokens=(16,), oldest_wait_ms=10), rollout)
    assert calm.rollout_step and calm.rollout_admit == ("w0",)
    late = ctl.plan(ServingView(decoding=2, waiting_prompt_tokens=(16,), oldest_wait_ms=150), rollout)
    assert not late.rollout_step and not late.rollout_admit and "TTFT" in late.reason


def test_a_slow_running_batch_is_shed_newest_first():
    slow = _model(2.0, 1.0)  # 1 ms per token
    ctl = SloController(SloConfig(ttft_ms=1000, tpot_ms=40, margin=0.0), serving_model=_model(2.0, 0.1),
                        rollout_model=slow)
    running = tuple(RolloutSeq(f"r{i}", 5, admitted_at=i) for i in range(60))
    plan = ctl.plan(ServingView(decoding=10), RolloutView(running))
    assert plan.rollout_step and plan.rollout_ms <= plan.budget_ms  # too slow even beside decodes alone:
    assert plan.rollout_preempt and plan.rollout_preempt[0] == "r59"  # waiting cannot help, shed at once


def test_a_batch_that_fits_beside_serving_decodes_waits_out_a_prefill_before_any_preemption():
    ctl = SloController(SloConfig(ttft_ms=1000, tpot_ms=40, margin=0.0), serving_model=_model(2.0, 0.1),
                        rollout_model=_model(2.0, 1.0))
    running = tuple(RolloutSeq(f"r{i}", 5, admitted_at=i) for i in range(20))  # 22 ms: fits 40 - 3 ms
    serving = ServingView(decoding=10, waiting_prompt_tokens=(200,))  # a 200-token prefill: 23 ms serving
    for waited in range(ctl.slo.rollout_waits):  # the batch waits the prefill out, keeping every sequence
        plan = ctl.plan(serving, RolloutView(running, waited=waited))
        assert not plan.rollout_step and not plan.rollout_preempt and "waits" in plan.reason
    plan = ctl.plan(serving, RolloutView(running, waited=ctl.slo.rollout_waits))  # then the newest go
    assert plan.rollout_step and plan.rollout_ms <= plan.budget_ms
    assert plan.rollout_preempt and plan.rollout_preempt[0] == "r19"
    plan = ctl.plan(ServingView(decoding=10), RolloutView(running))  # the prefill done: all of it runs
    assert plan.rollout_step and not plan.rollout_preempt


def test_latency_model_learns_a_line_and_errs_high():
    m = LatencyModel(base_ms=1.0, per_token_ms=0.01)
    for _ in range(200):
        for t in (4, 32, 128):
            m.observe(t, 3.0 + 0.2 * t)
    a, b = m.coefficients
    assert a == pytest.approx(3.0, abs=0.2) and b == pytest.approx(0.2, abs=0.01)
    assert m.predict(64) >= m.predict_mean(64) and m.predict(0) == 0.0


@pytest.mark.parametrize("kwargs, field", [({"ttft_ms": 0, "tpot_ms": 10}, "ttft_ms"),
                                           ({"ttft_ms": 100, "tpot_ms": -1}, "tpot_ms"),
                                           ({"ttft_ms": 100, "tpot_ms": 10, "attainment": 1.5}, "attainment"),
                                           ({"ttft_ms": 100, "tpot_ms": 10, "margin": 1.0}, "margin")])
def test_slo_config_is_validated(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        SloConfig(**kwargs)


@settings(max_examples=200, deadline=None)
@given(situations(), st.floats(0, 1), st.booleans())
def test_shared_memory_pressure_puts_rollout_to_sleep_and_it_wakes_only_with_room(s, usage, asleep):
    ctl, serving, rollout = s
    serving = ServingView(serving.decoding, serving.waiting_prompt_tokens, serving.oldest_wait_ms, kv_usage=usage)
    rollout = RolloutView(rollout.running if not asleep else (), rollout.waiting, can_sleep=True, asleep=asleep)
    plan = ctl.plan(serving, rollout)
    if usage >= ctl.caps.sleep_at:
        assert not plan.rollout_step and not plan.rollout_admit
        assert set(plan.rollout_preempt) == {r.request_id for r in rollout.running}
        assert plan.rollout_sleep is (None if asleep else True)
    if asleep and usage > ctl.caps.wake_at:
        assert plan.rollout_sleep is not False and not plan.rollout_admit
    if plan.rollout_admit and asleep:
        assert plan.rollout_sleep is False  # woken before anything runs on it


def test_measured_iteration_overhead_is_kept_out_of_the_rollout_budget():
    ctl = SloController(SloConfig(ttft_ms=1000, tpot_ms=40, margin=0.0), serving_model=_model(2.0, 0.0),
                        rollout_model=_model(1.0, 0.1))
    before = ctl.plan(ServingView(decoding=4), RolloutView()).budget_ms
    for _ in range(200):  # periods 6 ms longer than the two steps
        ctl.observe_iteration(period_ms=2.0 + 10.0 + 6.0, serving_ms=2.0, rollout_ms=10.0)
    after = ctl.plan(ServingView(decoding=4), RolloutView()).budget_ms
    assert ctl.overhead_ms == pytest.approx(6.0, abs=0.1)
    assert before - after == pytest.approx(ctl.overhead_ms + 2 * ctl.overhead_dev_ms)
    assert after < before - 5.9


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2000), st.integers(0, 2000), st.integers(0, 128))
def test_rollout_capacity_fits_the_budget_shrinks_with_load_and_respects_caps(load_a, load_b, max_seqs):
    ctl = SloController(SloConfig(ttft_ms=1000, tpot_ms=100), RolloutCaps(max_seqs=max_seqs),
                        serving_model=LatencyModel(5.0, 0.05), rollout_model=LatencyModel(4.0, 0.5))
    lo, hi = sorted((load_a, load_b))
    n_lo, n_hi = ctl.rollout_capacity(lo), ctl.rollout_capacity(hi)
    assert 0 <= n_hi <= n_lo <= max_seqs  # more serving load, no more rollout slots
    if lo == 0:
        assert n_lo == max_seqs  # no serving load: the caps alone
        return
    budget = 100 * (1 - ctl.slo.margin) - ctl.serving_model.predict(lo)
    if n_lo > 0:
        assert ctl.rollout_model.predict(n_lo) <= budget  # what is offered fits the TPOT budget
    if n_lo < max_seqs:
        assert ctl.rollout_model.predict(n_lo + 1) > budget  # and no more would


def test_rollout_capacity_is_zero_when_serving_alone_uses_the_budget():
    ctl = SloController(SloConfig(ttft_ms=1000, tpot_ms=20), RolloutCaps(max_seqs=64),
                        serving_model=LatencyModel(5.0, 1.0), rollout_model=LatencyModel(4.0, 0.5))
    assert ctl.rollout_capacity(1) > 0
    assert ctl.rollout_capacity(30) == 0  # 35 ms of serving step against a 17 ms budget


def test_with_no_serving_request_rollout_runs_even_when_the_model_predicts_nothing_fits():
    """A latency model that learned one very slow step (ms ~ 1000 at any size) must not stall rollout
    forever while the serving engine is idle: it would never see a rollout step to learn from."""
    slow = LatencyModel(5.0, 0.5)
    for _ in range(20):
        slow.observe(64, 1000.0)
    ctl = SloController(SloConfig(ttft_ms=1000, tpot_ms=100), RolloutCaps(max_seqs=3), rollout_model=slow)
    waiting = tuple(RolloutSeq(f"w{i}", 40) for i in range(5))
    plan = ctl.plan(ServingView(), RolloutView((), waiting))
    assert plan.rollout_step and plan.rollout_admit == ("w0", "w1", "w2")  # up to the caps
    assert ctl.rollout_capacity(0) == 3
    # A serving request arrives: the TPOT budget binds again, and the slow model keeps rollout out.
    busy = ctl.plan(ServingView(decoding=1), RolloutView((), waiting))
    assert not busy.rollout_step and busy.rollout_admit == ()
    assert ctl.rollout_capacity(1) == 0


@settings(max_examples=200, deadline=None)
@given(situations())
def test_every_preemption_carries_its_cause(s):
    ctl, serving, rollout = s
    plan = ctl.plan(serving, rollout)
    causes = plan.notes.get("preempt_causes", {})
    assert set(causes) == set(plan.rollout_preempt)
    if serving.kv_needed_tokens > serving.kv_free_tokens and plan.rollout_preempt:
        assert causes[plan.rollout_preempt[0]] == "serving KV pressure"  # memory is served first


def test_a_loose_tpot_budget_holds_several_rollout_steps_a_strict_one_alternates():
    running = tuple(RolloutSeq(f"r{i}", 100, admitted_at=float(i)) for i in range(16))
    serving = ServingView(decoding=8)
    loose = SloController(SloConfig(ttft_ms=1000, tpot_ms=150), serving_model=_model(8, 0.05),
                          rollout_model=_model(9, 0.1))
    plan = loose.plan(serving, RolloutView(running))
    # budget 150 * 0.85 - serving 8.4 = 119 ms; a step of 16 sequences 10.6 ms: 11 fit (the cap is 16)
    assert plan.rollout_step and plan.rollout_steps == loose.steps_beside(8, 16) == 11
    capped = SloController(SloConfig(ttft_ms=1000, tpot_ms=150, max_rollout_steps=8), serving_model=_model(8, 0.05),
                           rollout_model=_model(9, 0.1))
    assert capped.plan(serving, RolloutView(running)).rollout_steps == capped.steps_beside(8, 16) == 8
    strict = SloController(SloConfig(ttft_ms=1000, tpot_ms=150, max_rollout_steps=1), serving_model=_model(8, 0.05),
                           rollout_model=_model(9, 0.1))
    assert strict.plan(serving, RolloutView(running)).rollout_steps == 1
    tight = SloController(SloConfig(ttft_ms=1000, tpot_ms=25), serving_model=_model(8, 0.05),
                          rollout_model=_model(9, 0.1))
    assert tight.plan(serving, RolloutView(running)).rollout_steps == 1  # 21 - 8.4 = 12.9 ms: one step
    # a request this serving step prefills whole has its first token when the step ends: the steps go on
    waiting = ServingView(decoding=8, waiting_prompt_tokens=(20,), oldest_wait_ms=1.0)
    assert loose.plan(waiting, RolloutView(running)).rollout_steps == 11
    # one whose prompt needs more prefill steps waits the period out only while inside the TTFT guard (500 ms)
    long = ServingView(decoding=8, waiting_prompt_tokens=(loose.prefill_chunk + 1,), oldest_wait_ms=1.0)
    assert loose.plan(long, RolloutView(running)).rollout_steps > 1
    late = replace(long, oldest_wait_ms=420.0)  # 420 ms + a period of up to ~100 ms would pass 500
    assert loose.plan(late, RolloutView(running)).rollout_steps == 1


def test_latency_model_keeps_admissions_apart_from_the_decode_line():
    """Admission steps cost a per-request setup on top of their decodes. Fitted as one line in tokens,
    they raised the intercept every plain decode step is predicted with (seen: 16 ms learnt against
    5 ms measured, and no decode step fitted beside a serving step)."""
    m = LatencyModel(base_ms=5.0, per_token_ms=0.5, per_admit_ms=1.0, per_context_ms=0.05)
    for _ in range(100):
        for n in (8, 16, 24):
            m.observe(n, 4.0 + 0.2 * n)
        for k in (2, 4, 8):
            m.observe(16, 4.0 + 0.2 * 16 + 2.5 * k + 0.001 * 100 * k, admitted=k, context=100 * k)
    a, b = m.coefficients
    assert a == pytest.approx(4.0, abs=0.1) and b == pytest.approx(0.2, abs=0.01)
    assert m.predict_mean(16) == pytest.approx(7.2, abs=0.1)
    assert m.predict_mean(16, 4, 400) == pytest.approx(7.2 + 10.4, abs=0.2)


def test_latency_model_that_never_sees_admissions_keeps_their_prior():
    m = LatencyModel(base_ms=5.0, per_token_ms=0.5, per_admit_ms=1.5, per_context_ms=0.02)
    for _ in range(300):
        for n in (1, 16, 64):
            m.observe(n, 2.0 + 0.1 * n)
    assert m.admission_coefficients == pytest.approx((1.5, 0.02))
    assert m.coefficients == pytest.approx((2.0, 0.1), abs=1e-6)


def test_costly_admissions_do_not_evict_a_decode_batch_that_fits():
    """Beside a serving step the running batch decodes, and only as many waiting sequences are admitted
    as their setup leaves room for."""
    rollout = LatencyModel(4.0, 0.2, per_admit_ms=5.0, per_context_ms=0.0)
    ctl = SloController(SloConfig(ttft_ms=1000, tpot_ms=30, margin=0.15), serving_model=_model(5.0, 0.0),
                        rollout_model=rollout)
    running = tuple(RolloutSeq(f"r{i}", 50, admitted_at=float(i)) for i in range(16))
    waiting = tuple(RolloutSeq(f"w{i}", 50) for i in range(3))
    plan = ctl.plan(ServingView(decoding=4), RolloutView(running, waiting))
    assert plan.budget_ms == pytest.approx(30 * 0.85 - 5.0)
    assert plan.rollout_step and not plan.rollout_preempt
    assert plan.rollout_admit == ("w0", "w1")  # 4 + 0.2 * 18 + 2 * 5 = 17.6; a third: 22.8 > 20.5
    assert plan.rollout_ms == pytest.approx(17.6)


def test_waiting_sequences_join_between_an_iterations_steps_as_the_time_left_holds_them():
    class Fixed(LatencyModel):
        def observe(self, tokens, ms, admitted=0, context=0):
            pass

    # a step of n sequences admitting k of 20 context tokens each: 1 + 0.5 n + 1 k + 0.05 * 20 k ms
    model = Fixed(1.0, 0.5, per_admit_ms=1.0, per_context_ms=0.05)
    running = tuple(RolloutSeq(f"r{i}", 30) for i in range(4))
    waiting = tuple(RolloutSeq(f"w{i}", 20) for i in range(10))
    ctl = SloController(SloConfig(ttft_ms=300, tpot_ms=30), rollout_model=model)
    view = RolloutView(running, waiting)
    assert ctl.admit_between(view, 15.5) == ("w0", "w1", "w2", "w3", "w4")  # 3 + 2.5 k <= 15.5
    assert ctl.admit_between(view, 4.0) == ()  # not even one fits
    capped = SloController(SloConfig(ttft_ms=300, tpot_ms=30), RolloutCaps(max_seqs=6), rollout_model=model)
    assert capped.admit_between(view, 100.0) == ("w0", "w1")  # the caps hold as in a plan
    assert ctl.admit_between(RolloutView(running, waiting, kv_available_tokens=120 + 45), 100.0) == ("w0", "w1")
    assert ctl.admit_between(RolloutView(running, waiting, asleep=True), 100.0) == ()
