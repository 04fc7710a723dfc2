"""Rollouts on their engine's own event loop (pure logic, FakeEngine), for both rollout engines (a dedicated
worker's engine loop, a serving worker's co-serving executor): their turns never cross threads, each
iteration waits for the turns the last one woke, a caller that gives up does not end the loop, and a
stalled engine fails its groups' trajectories instead of holding them forever."""
import asyncio
import threading
import time

import pytest

from rose.errors import EngineError
from rose.ops.engine_calls import failed_group, on_engine_loop
from rose.ops.rollout import Partial, RolloutSpec, agent_loop
from rose.runtime.coserve.executor import CoServingExecutor
from rose.runtime.coserve.slo import SloConfig, SloController
from rose.runtime.engine import EngineLoop, SamplingSpec
from rose.runtime.engine import loop as loop_module
from rose.runtime.engine.fake import FakeEngine
from tests.helpers.envs import ScriptedEnv
from tests.unit.test_batching import CountingEngine
from tests.unit.test_engine_loop import WordTokenizer


class InlineScripted(ScriptedEnv):
    inline = True  # stepped on the loop itself, as guess and calc are


def _executor(engine):
    return CoServingExecutor(FakeEngine(), engine, SloController(SloConfig(ttft_ms=1000, tpot_ms=1000)))


@pytest.fixture(params=[EngineLoop, _executor], ids=["engine-loop", "co-serving-executor"])
def make(request):
    return request.param


@pytest.fixture
def tok():
    return WordTokenizer(["start", "obs", "ok"] + [str(i) for i in range(10)])


def _engine(tok, cls=FakeEngine):
    ok, nl = tok.vocab["ok"], tok.vocab["\n"]
    return cls(vocab_size=len(tok.vocab), max_model_len=64, script={"": [ok, nl, ok, nl, ok, nl]})


def _group(loop, tok, n, turns=3, max_turns=3):
    async def group():
        assert loop.on_loop()
        specs = [RolloutSpec(0, 0, i, "scripted", env_seed=i) for i in range(n)]
        return await asyncio.gather(*(agent_loop(s, InlineScripted(turns, max_turns), loop, tok, 64) for s in specs))
    return group


def test_rollouts_on_the_loop_meet_in_every_iteration(tok, make):
    """8 trajectories of 3 turns; one says its turns in 1 token, the others in 2. Each iteration is
    queued behind the turns the last one woke, so the short one's next turn joins the very next
    iteration, with the others still decoding: 8 a step until it ends, then 7 (across threads, or
    with the iteration queued first, a turn that comes back after the next iteration began misses it)."""
    ok, nl = tok.vocab["ok"], tok.vocab["\n"]
    engine = CountingEngine(vocab_size=len(tok.vocab), max_model_len=64, script={"s0-g0-i0": [nl], "": [ok, nl]})
    loop = make(engine)
    try:
        engine.batches.clear()  # the executor's warm-up step
        trajs = loop.run(_group(loop, tok, 8)()).result(10)
        assert all(t.finish_reason == "done" and len(t.turn_offsets) == 3 for t in trajs)
        assert engine.batches == [8, 8, 8, 7, 7, 7]
    finally:
        loop.close()


def test_groups_handed_over_one_by_one_start_in_one_iteration(tok):
    """A step's rollout tasks hand their groups to the idle loop one after another, from the worker's
    thread (`run`). Each group's first turns are made on the loop at once; the first iteration waits
    until the hand-offs stop, so it holds every group's turns, not the first group's alone."""
    ok, nl = tok.vocab["ok"], tok.vocab["\n"]
    engine = CountingEngine(vocab_size=len(tok.vocab), max_model_len=64, script={"": [ok, nl]})
    loop = EngineLoop(engine)
    try:
        futs = []
        for _ in range(4):
            futs.append(loop.run(_group(loop, tok, 8, turns=1, max_turns=1)()))
            time.sleep(0.003)  # longer than the loop's own quiet (START_LOOP_QUIET_S), well under START_QUIET_S
        assert all(t.finish_reason == "done" for f in futs for t in f.result(10))
        assert engine.batches[0] == 32
    finally:
        loop.close()


def test_the_first_iteration_waits_for_the_groups_known_to_be_on_their_way(tok, monkeypatch):
    """A dedicated worker tells its loop how many of its rollout tasks have started without handing their
    group over yet (`arriving`). The idle engine's first iteration waits for those, however long they take
    (START_MAX_S bounds the wait; raised here), rather than for a quiet spell after the last hand-off."""
    monkeypatch.setattr(loop_module, "START_MAX_S", 30.0)
    ok, nl = tok.vocab["ok"], tok.vocab["\n"]
    engine = CountingEngine(vocab_size=len(tok.vocab), max_model_len=64, script={"": [ok, nl]})
    on_their_way = [2]
    loop = EngineLoop(engine, arriving=lambda: on_their_way[0])
    try:
        futs = []
        for _ in range(2):
            futs.append(loop.run(_group(loop, tok, 8, turns=1, max_turns=1)()))
            on_their_way[0] -= 1  # counted off once handed over (`rollout_handed`)
            time.sleep(0.05)  # far longer than START_QUIET_S: a quiet spell would have stepped the first alone
        assert all(t.finish_reason == "done" for f in futs for t in f.result(10))
        assert engine.batches[0] == 16
    finally:
        loop.close()


def test_a_group_is_counted_off_only_once_it_is_on_its_way(tok):
    """The rollout task tells its worker its group is no longer on its way (`handed`) after the hand-off,
    not before: an idle engine that saw the count drop first would step without the group."""
    loop = EngineLoop(_engine(tok))
    events, hand_over = [], loop.run
    loop.run = lambda coro: (events.append("run"), hand_over(coro))[1]
    try:
        trajs = asyncio.run(on_engine_loop(loop, _group(loop, tok, 2), stall_s=10,
                                           handed=lambda: events.append("handed")))
        assert len(trajs) == 2 and events == ["run", "handed"]
    finally:
        loop.close()


@pytest.mark.parametrize("arriving", [None, lambda: 0], ids=["count-unknown", "none-counted"])
def test_groups_handed_over_as_the_last_ones_end_start_in_one_iteration(tok, arriving):
    """Groups waiting for slots (more groups than the worker's slots, or a round queued behind the running
    one) are handed over as the running groups end, the first of them while the engine's last iteration
    for those groups still runs. That first group's turns reach the engine just after it empties; they
    wait for the others, as from idle, and do not run alone (three iterations, out of phase with the rest
    for the whole round). They start one by one as slots free, so a worker's count of groups on their
    way (`arriving`) says nothing of them: they wait for a quiet spell all the same."""
    ok, nl = tok.vocab["ok"], tok.vocab["\n"]
    began, release = threading.Event(), threading.Event()

    class Gated(CountingEngine):
        def step(self):
            if len(self.batches) == 1:  # the first group's last iteration: held until the test lets it go
                began.set()
                release.wait(10)
            return super().step()

    engine = Gated(vocab_size=len(tok.vocab), max_model_len=64, script={"": [ok, nl]})
    loop = EngineLoop(engine, arriving=arriving)
    try:
        first = loop.run(_group(loop, tok, 8, turns=1, max_turns=1)())
        assert began.wait(10)
        futs = [loop.run(_group(loop, tok, 8, turns=1, max_turns=1)())]  # during the last iteration
        release.set()
        first.result(10)
        for _ in range(3):
            futs.append(loop.run(_group(loop, tok, 8, turns=1, max_turns=1)()))
            time.sleep(0.003)  # longer than the loop's own quiet (START_LOOP_QUIET_S), well under START_QUIET_S
        assert all(t.finish_reason == "done" for f in futs for t in f.result(10))
        assert engine.batches[:3] == [8, 8, 32]
    finally:
        loop.close()


def test_a_rollout_on_the_loop_gets_what_a_caller_on_another_thread_gets(tok, make):
    loop = make(_engine(tok))
    try:
        spec = RolloutSpec(0, 0, 0, "scripted", env_seed=3)
        here = loop.run(agent_loop(spec, InlineScripted(), loop, tok, 64)).result(10)
        there = asyncio.run(agent_loop(spec, InlineScripted(), loop, tok, 64))
        assert (here.token_ids, here.logprobs, here.loss_mask) == (there.token_ids, there.logprobs, there.loss_mask)
        assert here.finish_reason == there.finish_reason == "done"
    finally:
        loop.close()


def test_a_caller_on_the_loop_that_gives_up_leaves_the_loop_serving(tok, make):
    class Slow(FakeEngine):
        def step(self):
            time.sleep(0.02)
            return super().step()

    loop = make(Slow(vocab_size=16, max_model_len=64))
    try:
        async def give_up():
            fut = loop.agenerate([1, 2], SamplingSpec(max_tokens=20))
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await fut
            return fut.cancelled()

        assert loop.run(give_up()).result(10)  # its request finishes later, into a cancelled future
        assert len(loop.generate([1], SamplingSpec(max_tokens=3)).result(10).token_ids) == 3
    finally:
        loop.close()


class Stuck(FakeEngine):
    """An engine whose iterations hang until released (a hung kernel)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.release = threading.Event()

    def step(self):
        if set(self._reqs) != {"rose-warm-up"}:  # the executor's warm-up step goes through
            self.release.wait()
        return super().step()


def test_a_stalled_engine_fails_the_group_instead_of_holding_it(tok, make):
    engine = _engine(tok, Stuck)
    loop = make(engine)
    try:
        async def watch():
            return await on_engine_loop(loop, _group(loop, tok, 4), stall_s=0.3)

        t0 = time.monotonic()
        # the seconds it names are however long the stall lasted on a busy host: any whole number
        with pytest.raises(EngineError, match=r"finished no iteration in \d+ s with requests waiting") as e:
            asyncio.run(watch())
        assert time.monotonic() - t0 < 60 and "request_timeout_s=0.3" in str(e.value)
        assert loop.stalled_s() >= 0.3
    finally:
        engine.release.set()
        loop.close()


def test_a_healthy_engine_is_not_taken_for_stalled(tok, make):
    loop = make(_engine(tok))
    try:
        async def watch():
            return await on_engine_loop(loop, _group(loop, tok, 4), stall_s=0.3)

        assert all(t.finish_reason == "done" for t in asyncio.run(watch()))
        assert loop.stalled_s() == 0.0  # nothing waits
    finally:
        loop.close()


def test_a_failed_group_keeps_every_trajectory_and_what_it_had():
    class W:
        address, role = "tcp://w:1", "dedicated"

    specs = [RolloutSpec(0, 0, i, "scripted", env_seed=i) for i in range(3)]
    done = specs[0].trajectory(finish_reason="done")
    partial = specs[1].trajectory()
    partial.add_context([1, 2])
    out = failed_group(specs, [done, Partial(partial, 1), None], EngineError("stuck"), W())
    assert [t.trajectory_id for t in out] == [s.trajectory_id for s in specs]
    assert out[0] is done and out[0].finish_reason == "done"
    assert out[1].token_ids == [1, 2] and out[1].finish_reason == "failed" and "EngineError: stuck" in out[1].error
    assert out[2].finish_reason == "failed" and out[2].worker == "tcp://w:1"


def test_close_cancels_rollouts_still_on_the_loop(tok, make):
    engine = _engine(tok, Stuck)
    loop = make(engine)
    fut = loop.run(_group(loop, tok, 2)())
    time.sleep(0.1)
    engine.release.set()  # lets the thread out of its iteration so close can run
    loop.close()
    assert fut.done()
