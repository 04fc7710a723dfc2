"""Turn deadlines kept by the engine's own loop (rose/runtime/engine/deadlines.py): a turn not answered in
its `request_timeout_s` fails with that reason and leaves the engine; answered turns are dropped from the
list; the loop goes on serving the other turns. Pure logic (FakeEngine, a real asyncio loop)."""
import asyncio

from rose.errors import EngineError
from rose.ops.rollout import RolloutSpec, agent_loop
from rose.runtime.engine import EngineLoop, SamplingSpec
from rose.runtime.engine import deadlines as deadlines_module
from rose.runtime.engine.deadlines import Deadlines
from rose.runtime.engine.fake import FakeEngine
from tests.helpers.envs import ScriptedEnv
from tests.unit.test_engine_loop import WordTokenizer


class Hangs(FakeEngine):
    """Requests whose id starts with "hang" are taken and never answered (starved in the engine)."""

    def step(self):
        stuck = {rid: r for rid, r in self._reqs.items() if rid.startswith("hang")}
        for rid in stuck:
            del self._reqs[rid]
        try:
            return super().step()
        finally:
            self._reqs.update(stuck)


def test_the_list_fails_only_unanswered_turns_past_their_deadline_and_keeps_no_answered_one():
    expired = []

    async def main():
        loop = asyncio.get_running_loop()
        d = Deadlines(loop, lambda rid, fut, t: (expired.append((rid, t)), fut.set_exception(EngineError("late"))))
        answered, late, later = loop.create_future(), loop.create_future(), loop.create_future()
        d.add("answered", answered, 0.05)
        d.add("late", late, 0.05)
        d.add("later", later, 5.0)
        answered.set_result("ok")
        await asyncio.sleep(0.2)
        assert expired == [("late", 0.05)] and isinstance(late.exception(), EngineError)
        assert len(d) == 1 and not later.done()  # the answered turn is gone, the one not yet due stays
        later.set_result("ok")
        d.close()

    asyncio.run(main())


def test_the_list_is_swept_while_no_deadline_is_near(monkeypatch):
    """Turns with long deadlines answered long before: the list holds at most SWEEP_S of them."""
    monkeypatch.setattr(deadlines_module, "SWEEP_S", 0.05)

    async def main():
        loop = asyncio.get_running_loop()
        d = Deadlines(loop, lambda *a: None)
        for i in range(100):
            fut = loop.create_future()
            d.add(f"t{i}", fut, 600.0)
            fut.set_result(i)
        assert len(d) == 100
        await asyncio.sleep(0.2)
        assert len(d) == 0
        d.close()

    asyncio.run(main())


def test_a_turn_the_engine_never_answers_fails_at_its_deadline_and_leaves_the_engine():
    engine = Hangs(vocab_size=8, max_model_len=64)
    loop = EngineLoop(engine)
    try:
        async def turns():
            hung = loop.agenerate([1, 2], SamplingSpec(max_tokens=3), request_id="hang", timeout_s=0.2)
            fine = loop.agenerate([1, 2], SamplingSpec(max_tokens=3), request_id="fine", timeout_s=0.2)
            assert len((await fine).token_ids) == 3
            try:
                await hung
            except EngineError as e:
                return str(e)

        reason = loop.run(turns()).result(10)
        assert "no answer from the engine in 0.2 s (request_timeout_s)" in reason and "hang#" in reason
        assert not engine.has_unfinished()  # aborted, not left to run
        assert len(loop.generate([1], SamplingSpec(max_tokens=2)).result(5).token_ids) == 2  # serves on
    finally:
        loop.close()


def test_a_trajectory_on_the_engine_loop_fails_with_the_deadline_of_the_turn_that_hung():
    tok = WordTokenizer(["start", "obs", "ok"])
    engine = Hangs(vocab_size=len(tok.vocab), max_model_len=64)
    loop = EngineLoop(engine)
    try:
        # a request id starts with the trajectory id: "hang" matches none, so hang every request
        engine.step = lambda: []
        spec = RolloutSpec(0, 0, 0, "scripted", env_seed=1, request_timeout_s=0.2)
        traj = loop.run(agent_loop(spec, ScriptedEnv(), loop, tok, max_model_len=64)).result(10)
        assert traj.finish_reason == "failed" and "no answer from the engine in 0.2 s" in traj.error
    finally:
        loop.close()
