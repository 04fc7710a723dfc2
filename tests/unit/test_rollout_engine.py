"""Both rollout engines (the engine loop, the co-serving executor) keep the `RolloutEngine` contract, on
FakeEngines (logic only); and the pending-request handling they share."""
import time
from concurrent.futures import Future

import pytest

from rose.errors import EngineError
from rose.runtime.coserve.executor import CoServingExecutor
from rose.runtime.coserve.slo import SloConfig, SloController
from rose.runtime.engine import EngineLoop, EngineOutput, Generation, RolloutEngine, SamplingSpec
from rose.runtime.engine.fake import FakeEngine
from rose.runtime.engine.pending import PendingRollout, absorb, fail


def _loop(engine):
    return EngineLoop(engine)


def _executor(engine):
    return CoServingExecutor(FakeEngine(), engine, SloController(SloConfig(ttft_ms=1000, tpot_ms=1000)))


@pytest.fixture(params=[_loop, _executor], ids=["engine-loop", "co-serving-executor"])
def make(request):
    made = []

    def make(engine=None):
        made.append(request.param(engine or FakeEngine()))
        return made[-1]
    yield make
    for x in made:
        x.close()


def test_both_are_rollout_engines(make):
    assert isinstance(make(), RolloutEngine)


def test_a_request_and_a_weight_load_go_through(make):
    engine = FakeEngine()
    x = make(engine)
    assert x.weight_version == 0
    g0 = x.generate([1, 2], SamplingSpec(max_tokens=3), request_id="a").result(timeout=10)
    assert isinstance(g0, Generation) and g0.finish_reason == "length"
    assert len(g0.token_ids) == len(g0.logprobs) == 3 and g0.weight_versions == [0, 0, 0]
    assert 0 <= g0.queue_s <= g0.total_s
    assert x.load_weights({}, 4).result(timeout=10) == 4
    assert x.weight_version == engine.weight_version == 4
    g1 = x.generate([1, 2], SamplingSpec(max_tokens=2, stop_token_ids=(99,))).result(timeout=10)
    assert g1.weight_versions == [4, 4]
    c = x.counters()
    assert c["rollout_tokens"] == 5 and c["rollout_steps"] >= 3


def test_a_bad_prompt_fails_that_request_only(make):
    x = make(FakeEngine(max_model_len=8))
    bad = x.generate(list(range(20)), SamplingSpec(max_tokens=2))
    good = x.generate([1], SamplingSpec(max_tokens=2))
    with pytest.raises(Exception, match="does not fit"):
        bad.result(timeout=10)
    assert len(good.result(timeout=10).token_ids) == 2


def test_close_fails_what_is_unfinished(make):
    x = make(FakeEngine(max_model_len=10**9))
    fut = x.generate([1], SamplingSpec(max_tokens=10**9), request_id="long")
    deadline = time.monotonic() + 10
    while not x.counters()["rollout_tokens"] and time.monotonic() < deadline:  # in the engine now
        time.sleep(0.001)
    x.close()
    with pytest.raises(EngineError, match="closed with the request unfinished"):
        fut.result(timeout=10)


def test_absorb_routes_outputs_stamps_versions_and_fails_errors_alone():
    pending = {"a~1": PendingRollout("a", Future(), t_submit=0.0), "b": PendingRollout("b", Future(), t_submit=0.0)}
    a, b = pending["a~1"], pending["b"]
    n = absorb(pending, [EngineOutput("a~1", [5, 6], [-0.5, -0.25], False, None),
                         EngineOutput("gone", [7], [-1.0], False, None)], version=3, now=1.0)
    assert n == 2 and set(pending) == {"a~1", "b"}
    n = absorb(pending, [EngineOutput("a~1", [8], [-1.0], True, "stop"),
                         EngineOutput("b", [], [], True, "abort", error="log-probs missing")], version=4, now=2.5)
    assert n == 1 and not pending
    g = a.future.result(timeout=0)
    assert g.token_ids == [5, 6, 8] and g.logprobs == [-0.5, -0.25, -1.0] and g.weight_versions == [3, 3, 4]
    assert g.finish_reason == "stop" and g.queue_s == 1.0 and g.total_s == 2.5
    with pytest.raises(EngineError, match="log-probs missing") as e:
        b.future.result(timeout=0)
    assert e.value.context["request_id"] == "b"  # the caller's id, not the engine's


def test_a_started_output_gives_the_queue_time_of_a_request_whose_tokens_come_at_its_end():
    # VllmEngine(stream=False): a token-less `started` output at the first token, all tokens at the end
    pending = {"a": PendingRollout("a", Future(), t_submit=0.0), "b": PendingRollout("b", Future(), t_submit=0.0)}
    a, b = pending["a"], pending["b"]
    assert absorb(pending, [EngineOutput("a", [], [], False, None, started=True)], version=0, now=0.5) == 0
    absorb(pending, [EngineOutput("b", [], [], False, None, started=True),  # first and last token in one iteration
                     EngineOutput("b", [4], [-0.5], True, "stop"),
                     EngineOutput("a", [5, 6, 7], [-1.0, -1.0, -1.0], True, "length")], version=0, now=2.0)
    ga, gb = a.future.result(timeout=0), b.future.result(timeout=0)
    assert ga.queue_s == 0.5 and ga.total_s == 2.0 and ga.token_ids == [5, 6, 7]
    assert gb.queue_s == 2.0 == gb.total_s and gb.token_ids == [4]


def test_fail_names_each_request():
    ps = [PendingRollout(f"r{i}", Future()) for i in range(2)]
    fail(ps, "gone")
    for p in ps:
        with pytest.raises(EngineError, match="gone") as e:
            p.future.result(timeout=0)
        assert e.value.context["request_id"] == p.request_id
