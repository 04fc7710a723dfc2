"""An engine iteration that fails costs a retry of the requests in it, never a trajectory, and never
the thread that steps the engine."""
import asyncio

import pytest

from rose.errors import EngineError
from rose.ops.engine_calls import ENGINE_RETRIES
from rose.ops.rollout import RolloutSpec, agent_loop
from rose.runtime.coserve.executor import CoServingExecutor
from rose.runtime.coserve.slo import SloConfig, SloController
from rose.runtime.engine import EngineLoop, SamplingSpec
from rose.runtime.engine.fake import FakeEngine
from tests.helpers.envs import ScriptedEnv
from tests.unit.test_engine_loop import WordTokenizer


class FailingSteps(FakeEngine):
    """Raises on its iterations number `fail_at` (1-based), as vLLM did on a seeded CPU generator."""

    def __init__(self, fail_at=(), **kwargs):
        super().__init__(**kwargs)
        self.fail_at, self.n = set(fail_at), 0

    def step(self):
        self.n += 1
        if self.n in self.fail_at:
            raise RuntimeError("CPU Generator does not use offset")
        return super().step()


@pytest.fixture
def tok():
    return WordTokenizer(["start", "obs", "ok"])


def _loop(tok, fail_at):
    ok, nl = tok.vocab["ok"], tok.vocab["\n"]
    return EngineLoop(FailingSteps(fail_at, vocab_size=len(tok.vocab), max_model_len=64, script={"": [ok, nl]}))


def test_a_failed_engine_step_is_retried_not_a_failed_trajectory(tok):
    loop = _loop(tok, fail_at={2, 5})  # fails mid-turn, twice
    try:
        spec = RolloutSpec(0, 0, 0, "scripted", env_seed=1)
        traj = asyncio.run(agent_loop(spec, ScriptedEnv(turns=3), loop, tok, max_model_len=64))
    finally:
        loop.close()
    assert traj.finish_reason == "done" and traj.error is None
    assert [t for t, m in zip(traj.token_ids, traj.loss_mask) if m] == [tok.vocab["ok"], tok.vocab["\n"]] * 3


def test_an_engine_that_keeps_failing_fails_the_trajectory_with_the_reason(tok):
    loop = _loop(tok, fail_at=set(range(1, 100)))
    try:
        traj = asyncio.run(agent_loop(RolloutSpec(0, 0, 0, "scripted", env_seed=1), ScriptedEnv(), loop, tok,
                                      max_model_len=64))
    finally:
        loop.close()
    assert traj.finish_reason == "failed" and "CPU Generator does not use offset" in traj.error
    assert loop.engine.n == ENGINE_RETRIES + 1  # the first try and each retry, then it gives up


def test_the_executor_survives_failing_engine_steps():
    ex = CoServingExecutor(FailingSteps(), FailingSteps(), SloController(SloConfig(1000, 1000)))
    try:
        # each engine's next iteration fails (the warm-up when built took the first ones)
        ex.rollout.fail_at, ex.serving.fail_at = {ex.rollout.n + 1}, {ex.serving.n + 1}
        rollout = ex.generate([1, 2, 3], SamplingSpec(max_tokens=4), request_id="r")
        served = ex.serve([4, 5], SamplingSpec(max_tokens=4))
        with pytest.raises(EngineError, match="rollout engine step failed") as info:
            rollout.result(timeout=10)
        assert info.value.context["retryable"] is True
        _, reason = served.collect(timeout=10)
        assert reason.startswith("error: serving engine step failed")
        # the executor goes on: both kinds of work run after the failures
        again = ex.generate([1, 2, 3], SamplingSpec(max_tokens=4), request_id="r2").result(timeout=10)
        assert len(again.token_ids) == 4
        assert len(ex.serve([4, 5], SamplingSpec(max_tokens=4)).collect(timeout=10)[0]) == 4
    finally:
        ex.close()


class SlowSteps(FakeEngine):
    def step(self):
        import time

        time.sleep(0.05)
        return super().step()


def test_commands_still_queued_at_close_resolve():
    # A weight load waits for the requests in flight; closing the loop meanwhile must not leave its
    # caller waiting forever.
    loop = EngineLoop(SlowSteps())
    gen = loop.generate([1, 2], SamplingSpec(max_tokens=50))
    load = loop.load_weights({}, 3)
    loop.close()
    with pytest.raises(EngineError, match="closed"):
        gen.result(timeout=5)
    with pytest.raises(EngineError, match="closed before this load command applied"):
        load.result(timeout=5)


def test_executor_commands_still_queued_at_close_resolve():
    ex = CoServingExecutor(SlowSteps(), SlowSteps(), SloController(SloConfig(1000, 1000)))
    rollout = ex.generate([1, 2], SamplingSpec(max_tokens=50), request_id="r")
    load = ex.load_weights({}, 3)
    served = ex.serve([4, 5], SamplingSpec(max_tokens=4))
    ex.close()
    with pytest.raises(EngineError):
        rollout.result(timeout=5)
    with pytest.raises(EngineError, match="closed before this load command applied"):
        load.result(timeout=5)
    _, reason = served.collect(timeout=5)
    assert reason.startswith("error:")  # it queued behind the load, which waited for the rollout


class Silent:
    """An engine that takes requests and never answers (a stalled device)."""

    weight_version = 0

    def generate(self, prompt, spec, request_id=None):
        from concurrent.futures import Future

        return Future()


def test_a_turn_without_an_answer_fails_its_trajectory_at_the_deadline(tok):
    spec = RolloutSpec(0, 0, 0, "scripted", env_seed=1, request_timeout_s=0.2)
    traj = asyncio.run(agent_loop(spec, ScriptedEnv(), Silent(), tok, max_model_len=64))
    assert traj.finish_reason == "failed" and "no answer from the engine in 0.2 s" in traj.error


def test_a_caller_that_gives_up_does_not_end_the_engine_thread():
    # Dask cancels a rollout task's coroutine when the task is released; the request it waited on
    # still finishes in the engine, whose thread must live on for everyone else's.
    loop = EngineLoop(SlowSteps())

    async def give_up():
        task = asyncio.ensure_future(asyncio.wrap_future(loop.generate([1, 2], SamplingSpec(max_tokens=5))))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.5)  # the request finishes in the engine meanwhile

    try:
        asyncio.run(give_up())
        assert len(loop.generate([1, 2], SamplingSpec(max_tokens=3)).result(timeout=5).token_ids) == 3
    finally:
        loop.close()
