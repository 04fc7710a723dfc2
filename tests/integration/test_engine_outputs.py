"""A dedicated worker's engine returns each request's tokens at its end only, with a token-less output at
its first token (`VllmEngine(stream=False)`): the caller gets the same tokens, log-probs and queue time
as when every token streams."""
import pytest

from tests.integration.helpers import run_engine_helper

pytestmark = pytest.mark.integration


def test_an_engine_that_does_not_stream_gives_the_same_generation_in_two_outputs():
    seen = run_engine_helper("stream_check.py")
    streamed, whole = seen["True"], seen["False"]
    n = len(streamed["tokens"])
    assert n > 2  # long enough that the two modes differ in outputs
    assert streamed["outputs"] == n  # one output per token
    assert whole["outputs"] == 2  # the first token's `started` (no tokens), then all of them at the end
    assert whole["tokens"] == streamed["tokens"] and whole["versions"] == streamed["versions"] == [0] * n
    assert whole["logprobs"] == pytest.approx(streamed["logprobs"], abs=1e-4)
    for g in (streamed, whole):
        assert 0 < g["queue_s"] < g["total_s"]
