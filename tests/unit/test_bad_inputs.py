"""Bad inputs from user code fail one trajectory each, with a reason naming what was wrong, and nothing
else: environments that raise, hang or answer nonsense, and prompts longer than the context. The agent
loop runs on a FakeEngine behind a real engine loop (logic only); the integration test in
tests/integration/test_bad_inputs.py runs the same cases on real vLLM engines and Dask workers."""
import asyncio
import threading
import time

import pytest

from rose.config import EngineConfig
from rose.envs.base import StepResult, is_inline
from rose.envs.guess import GuessEnv
from rose.envs.deadline import DeadlineExceeded, abandoned_calls, call_with_deadline
from rose.errors import ConfigError, EnvError
from rose.graph import LowerContext, lower, rl_step
from rose.ops.rollout import RolloutSpec, agent_loop, env_call
from rose.runtime.engine import EngineLoop
from rose.runtime.engine.fake import FakeEngine
from tests.helpers.envs import HangingEnv, LongPromptEnv, NanRewardEnv, RaisingEnv, ScriptedEnv
from tests.unit.test_engine_loop import WordTokenizer


@pytest.fixture
def loop_and_tok():
    tok = WordTokenizer(["start", "obs", "ok", "guess", "find", "higher", "lower", "correct"] +
                        [str(i) for i in range(20)])
    ok, nl = tok.vocab["ok"], tok.vocab["\n"]
    loop = EngineLoop(FakeEngine(vocab_size=len(tok.vocab), max_model_len=64, script={"": [ok, nl, ok, nl]}))
    yield loop, tok
    loop.close()


@pytest.fixture
def hang():
    HangingEnv.release.clear()
    yield
    HangingEnv.release.set()  # let the abandoned threads finish


def _run(*jobs):
    async def all_of():
        return await asyncio.gather(*jobs)
    return asyncio.run(all_of())


def test_env_timeout_is_a_validated_engine_setting_carried_to_every_rollout():
    assert EngineConfig().env_timeout_s == 60.0
    for bad in (0, -1.0, float("nan"), "10"):
        with pytest.raises(ConfigError, match="EngineConfig.env_timeout_s"):
            EngineConfig(env_timeout_s=bad)
    low = lower(rl_step("g", "guess", 2, 2), LowerContext(0, 0, "g", env_timeout_s=7.5))
    specs = low.outputs[("prompts", "specs")]
    assert len(specs) == 4 and {s.env_timeout_s for s in specs} == {7.5}


def test_an_env_that_raises_fails_its_trajectory_naming_env_turn_and_id(loop_and_tok):
    loop, tok = loop_and_tok
    bad, good = _run(agent_loop(RolloutSpec(2, 3, 0, "raising", env_seed=1), RaisingEnv(), loop, tok, 64),
                     agent_loop(RolloutSpec(2, 3, 1, "scripted", env_seed=1), ScriptedEnv(), loop, tok, 64))
    assert bad.finish_reason == "failed"
    assert bad.error.startswith("EnvError: environment 'raising' step at turn 0 raised RuntimeError: "
                                "environment exploded on purpose")
    assert "trajectory_id='s2-g3-i0'" in bad.error and "turn=0" in bad.error
    assert "envs.py" in bad.error  # the last frames of the environment's own code
    assert good.finish_reason == "done"


def test_an_env_that_hangs_fails_at_the_deadline_and_the_rest_of_the_group_goes_on(loop_and_tok, hang):
    loop, tok = loop_and_tok
    hung_spec = RolloutSpec(0, 5, 0, "hanging", env_seed=1, env_timeout_s=0.3)  # odd seed: step hangs
    hung, other, again = _run(agent_loop(hung_spec, HangingEnv(), loop, tok, 64),
                              agent_loop(RolloutSpec(0, 5, 1, "scripted", env_seed=1), ScriptedEnv(), loop, tok, 64),
                              agent_loop(RolloutSpec(0, 5, 2, "hanging", env_seed=2), HangingEnv(), loop, tok, 64))
    assert hung.finish_reason == "failed"
    assert "environment 'hanging' step at turn 0 did not return within env_timeout_s=0.3 s" in hung.error
    assert "trajectory_id='s0-g5-i0'" in hung.error and "cannot be cancelled" in hung.error
    assert len(hung.turn_offsets) == 1  # the policy's turn before the hang is kept
    assert other.finish_reason == "done" and again.finish_reason != "failed"
    # the hung call still holds its thread, counted, until it returns on its own
    assert abandoned_calls() >= 1
    HangingEnv.release.set()
    for _ in range(1000):
        if abandoned_calls() == 0:
            break
        time.sleep(0.01)
    assert abandoned_calls() == 0


class ResetRaises(ScriptedEnv):
    name = "reset_raises"

    def reset(self, seed):
        raise KeyError("no such task")


class ResetHangs(ScriptedEnv):
    name = "reset_hangs"

    def reset(self, seed):
        HangingEnv.release.wait(30)
        return super().reset(seed)


class ResetNotText(ScriptedEnv):
    name = "reset_not_text"

    def reset(self, seed):
        return ["start"]


class StepNotResult(ScriptedEnv):
    name = "step_not_result"

    def step(self, action):
        return ("obs", 1.0, True)


class StepNotText(ScriptedEnv):
    name = "step_not_text"

    def step(self, action):
        return StepResult(None, 1.0, True)


@pytest.mark.parametrize("env, words", [
    (ResetRaises(), "environment 'reset_raises' reset at turn 0 raised KeyError: 'no such task'"),
    (ResetHangs(), "environment 'reset_hangs' reset at turn 0 did not return within env_timeout_s=0.3 s"),
    (ResetNotText(), "environment 'reset_not_text' reset returned ['start']; expected the first observation"),
    (StepNotResult(), "environment 'step_not_result' step at turn 0 returned ('obs', 1.0, True); expected a "
                      "StepResult"),
    (StepNotText(), "step at turn 0 returned StepResult(observation=None"),
    (NanRewardEnv(), "environment 'nan_reward' step at turn 0 returned StepResult(observation='"),
])
def test_an_env_that_answers_nonsense_fails_its_trajectory_with_what_it_said(loop_and_tok, hang, env, words):
    loop, tok = loop_and_tok
    traj = asyncio.run(agent_loop(RolloutSpec(1, 0, 4, env.name, env_seed=1, env_timeout_s=0.3), env, loop, tok, 64))
    assert traj.finish_reason == "failed" and words in traj.error, traj.error
    assert "trajectory_id='s1-g0-i4'" in traj.error
    if isinstance(env, NanRewardEnv):
        assert "reward=nan" in traj.error


def test_an_env_that_cannot_be_built_names_the_env_and_trajectory():
    def build():
        raise TypeError("__init__() got an unexpected keyword argument 'levle'")

    spec = RolloutSpec(0, 1, 2, "maze", env_seed=1)
    with pytest.raises(EnvError, match=r"environment 'maze' construction raised TypeError: .*levle") as info:
        asyncio.run(env_call(spec, "construction", None, build))
    assert info.value.context == {"trajectory_id": "s0-g1-i2", "env": "maze"}


def test_the_deadline_runs_calls_off_the_event_loop_and_passes_their_own_errors_through():
    import threading

    async def main():
        assert await call_with_deadline(threading.current_thread, timeout_s=5) is not threading.current_thread()
        with pytest.raises(TimeoutError, match="my own"):  # the env's own TimeoutError is not the deadline
            await call_with_deadline(lambda: (_ for _ in ()).throw(TimeoutError("my own")), timeout_s=5)
        with pytest.raises(RuntimeError, match="StopIteration"):  # in a coroutine it would lose its name
            await call_with_deadline(lambda: next(iter(())), timeout_s=5)
        with pytest.raises(DeadlineExceeded):
            await call_with_deadline(threading.Event().wait, 2, timeout_s=0.05)
    asyncio.run(main())


def test_a_prompt_longer_than_the_context_fails_naming_its_tokens_and_the_limit(loop_and_tok):
    loop, tok = loop_and_tok
    long_, ok = _run(agent_loop(RolloutSpec(0, 0, 7, "long_prompt", env_seed=1), LongPromptEnv(), loop, tok, 64),
                     agent_loop(RolloutSpec(0, 0, 8, "scripted", env_seed=1), ScriptedEnv(), loop, tok, 64))
    assert long_.finish_reason == "failed" and not long_.turn_offsets  # nothing was sent to the engine
    assert long_.error == ("PromptTooLongError: prompt of 302 tokens does not fit the model's context "
                           "(max_model_len=64) [trajectory_id='s0-g0-i7', env='long_prompt']")
    assert ok.finish_reason == "done"


class WhereEnv(ScriptedEnv):
    """Records the thread each call runs on."""

    threads: list[str] = []

    def step(self, action):
        WhereEnv.threads.append(threading.current_thread().name)
        return super().step(action)


class InlineWhereEnv(WhereEnv):
    inline = True


class RaisingInlineEnv(RaisingEnv):
    inline = True


def test_an_inline_env_runs_on_the_event_loop_and_a_subclass_must_say_so_again(loop_and_tok):
    """`inline = True` moves an environment's calls onto the rollout's own thread; a subclass does not
    inherit it (its step may block: HangingEnv is a GuessEnv whose step hangs), and an inline env that
    raises still fails its trajectory alone, with the reason."""
    loop, tok = loop_and_tok
    assert is_inline(GuessEnv) and not is_inline(HangingEnv) and not is_inline(WhereEnv)
    for env, thread in ((InlineWhereEnv(), "MainThread"), (WhereEnv(), "rose-env")):
        WhereEnv.threads.clear()
        (traj,) = _run(agent_loop(RolloutSpec(1, 0, 0, "scripted", env_seed=1), env, loop, tok, 64))
        assert traj.finish_reason == "done" and WhereEnv.threads == [thread] * 2
    bad, = _run(agent_loop(RolloutSpec(2, 3, 0, "raising", env_seed=1), RaisingInlineEnv(), loop, tok, 64))
    assert bad.finish_reason == "failed" and "step at turn 0 raised RuntimeError" in bad.error
