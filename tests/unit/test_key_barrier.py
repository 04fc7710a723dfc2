"""The scheduler's wait for tasks to end (`rose_keys_done`), without processes: what counts as ended,
and a cancelled wait leaves nothing behind; a receiver's wait to be clear of a step's rollout groups
(`clear_of`, `KeyBarrier.wait` with a worker): when it may commit the next version while other
workers still run them."""
import asyncio
from types import SimpleNamespace

import pytest

from rose.runtime.placement import RolloutTask
from rose.runtime.scheduler.barrier import KeyBarrier, clear_of
from rose.runtime.scheduler.plugin import RoseScheduler


def _tasks(**states):
    return {k: SimpleNamespace(state=v) for k, v in states.items()}


def test_keys_already_ended_or_unknown_do_not_wait():
    async def go():
        b = KeyBarrier()
        n = await asyncio.wait_for(b.wait(_tasks(a="memory", b="erred"), ["a", "b", "gone"]), 1)
        return n, b.calls, b.waited, b.waits

    assert asyncio.run(go()) == (0, 1, 0, 0)


def _to(tasks, b, key, state):
    tasks[key].state = state
    b.recheck(tasks, {})


def test_a_wait_ends_once_every_key_has_ended_and_not_before():
    async def go():
        b, tasks = KeyBarrier(), _tasks(a="processing", b="no-worker", c="memory")
        waiter = asyncio.ensure_future(b.wait(tasks, ["a", "b", "c"]))
        await asyncio.sleep(0)
        seen = []
        # a retry (its worker left) and a task still waiting for a worker have not ended
        for key, state in (("a", "released"), ("a", "waiting"), ("b", "processing"), ("a", "memory")):
            _to(tasks, b, key, state)
            await asyncio.sleep(0)
            seen.append(waiter.done())
        _to(tasks, b, "b", "erred")  # a failed task has ended too
        n = await asyncio.wait_for(waiter, 1)
        return seen, n, b.waits, b.waited

    seen, n, left, waited = asyncio.run(go())
    assert seen == [False, False, False, False]
    assert n == 2 and left == 0 and waited == 1


def test_two_callers_on_one_key_both_return_and_a_forgotten_key_counts_as_ended():
    async def go():
        b, tasks = KeyBarrier(), _tasks(a="processing")
        w1 = asyncio.ensure_future(b.wait(tasks, ["a"]))
        w2 = asyncio.ensure_future(b.wait(tasks, ["a"]))
        await asyncio.sleep(0)
        del tasks["a"]  # the scheduler forgot it
        b.recheck(tasks, {})
        return await asyncio.wait_for(asyncio.gather(w1, w2), 1), b.waits

    assert asyncio.run(go()) == ([1, 1], 0)


def test_a_cancelled_wait_leaves_nothing_registered():
    async def go():
        b, tasks = KeyBarrier(), _tasks(a="processing", b="processing")
        waiter = asyncio.ensure_future(b.wait(tasks, ["a", "b"]))
        await asyncio.sleep(0)
        _to(tasks, b, "a", "memory")
        registered = b.waits
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return registered, b.waits

    assert asyncio.run(go()) == (1, 0)


def test_the_plugin_wakes_its_barrier_for_tasks_it_does_not_place():
    """The sync waits on the next step's rollout keys; the hook rechecks the barrier when a task it does
    not manage ends (a key the book no longer holds, or never held, is still waited on)."""
    async def go():
        plugin = RoseScheduler()
        plugin.scheduler = SimpleNamespace(tasks=_tasks(r="processing"), workers={}, loop=None)
        waiter = asyncio.ensure_future(plugin._h_keys_done(keys=["r"]))
        await asyncio.sleep(0)
        plugin.scheduler.tasks["r"].state = "memory"
        plugin.transition("r", "processing", "memory", stimulus_id="t")
        b = plugin.barrier
        return await asyncio.wait_for(waiter, 1), plugin.errors, (b.calls, b.waited, b.waits)

    reply, errors, barrier = asyncio.run(go())
    assert reply == {"waited_for": 1} and errors == 0
    assert barrier == (1, 1, 0)


@pytest.mark.parametrize("inflight, clear", [
    ({"D": ["a", "b"]}, {"W": True, "D": False}),  # both groups run on D
    ({"D": ["a"], "W": ["b"]}, {"W": False, "D": False}),  # each worker runs one
    ({"D": ["a"]}, {"W": False, "D": False}),  # b has nothing running: it may go anywhere
    ({"D": ["a", "b-resume1"]}, {"W": True, "D": False}),  # b's continuation counts as b
    ({"D": ["a"], "W": ["b-resume1"]}, {"W": False, "D": False}),
    ({"D": ["a", "b", "x"], "W": ["y"]}, {"W": True, "D": False}),  # other groups are not waited on
])
def test_a_worker_is_clear_once_every_group_left_runs_elsewhere(inflight, clear):
    assert {w: clear_of(w, {"a", "b"}, inflight) for w in ("W", "D")} == clear


def test_no_groups_left_is_clear_and_a_key_no_worker_runs_holds_everyone():
    assert clear_of("W", set(), {"W": ["a"]}) is True  # a is not waited on
    assert clear_of("W", {"plain-task"}, {"D": ["a"]}) is False  # no rollout group: wait for it to end
    assert clear_of(None, {"a"}, {"D": ["a"]}) is False  # no worker: wait for every group to end
    assert clear_of(None, set(), {"D": ["a"]}) is True


def _plugin():
    """A placement plugin over a stand-in scheduler that holds rollout tasks `a` and `b` (one group each)."""
    plugin = RoseScheduler()
    tasks = {k: SimpleNamespace(state="no-worker", processing_on=None) for k in ("a", "b", "a-resume1")}
    plugin.scheduler = SimpleNamespace(tasks=tasks, workers={}, loop=SimpleNamespace(add_callback=lambda f: None),
                                       unrunnable=set())
    plugin.book.on_parked([RolloutTask("a", 4, 1), RolloutTask("b", 4, 1)], 0.0, "t")
    return plugin


def _move(plugin, key, start, finish, worker=None):
    ts = plugin.scheduler.tasks[key]
    ts.state, ts.processing_on = finish, SimpleNamespace(address=worker) if worker else None
    plugin.transition(key, start, finish, stimulus_id="t")


def test_each_receiver_is_told_once_it_runs_none_of_the_step_and_none_can_come_back():
    """Group b runs on W, a on D. W may commit once b ends; D only once a does, however its work moves
    meanwhile (a shed task's continuation, parked, then running on D again)."""
    async def go():
        plugin = _plugin()
        _move(plugin, "a", "no-worker", "processing", "D")
        _move(plugin, "b", "no-worker", "processing", "W")
        w = asyncio.ensure_future(plugin._h_keys_done(keys=["a", "b"], worker="W"))
        d = asyncio.ensure_future(plugin._h_keys_done(keys=["a", "b"], worker="D"))
        seen = []

        async def look(label):
            await asyncio.sleep(0)
            seen.append((label, w.done(), d.done()))

        await look("both running")
        _move(plugin, "b", "processing", "memory")
        await look("b ended")
        plugin._h_yielded(key="a", worker="D")  # a's continuation is on its way: a could go anywhere
        await look("a yielded")
        plugin.book.on_parked([RolloutTask("a-resume1", 4, 1)], 0.0, "t")
        _move(plugin, "a-resume1", "no-worker", "processing", "D")
        await look("continuation on D")
        _move(plugin, "a-resume1", "processing", "memory")
        _move(plugin, "a", "processing", "memory")
        await look("a ended")
        return seen, await asyncio.wait_for(asyncio.gather(w, d), 1), plugin.errors, plugin.barrier.waits

    seen, replies, errors, left = asyncio.run(go())
    assert seen == [("both running", False, False), ("b ended", True, False), ("a yielded", True, False),
                    ("continuation on D", True, False), ("a ended", True, True)]
    assert replies == [{"waited_for": 2}, {"waited_for": 2}] and errors == 0 and left == 0


def test_a_receiver_is_not_told_while_a_group_waits_for_a_worker():
    """A group still parked may be placed on any worker: no receiver may move on before it runs."""
    async def go():
        plugin = _plugin()
        _move(plugin, "b", "no-worker", "processing", "D")
        w = asyncio.ensure_future(plugin._h_keys_done(keys=["a", "b"], worker="W"))
        await asyncio.sleep(0)
        before = w.done()
        _move(plugin, "a", "no-worker", "processing", "D")
        return before, await asyncio.wait_for(w, 1)

    assert asyncio.run(go()) == (False, {"waited_for": 2})


def test_a_receiver_whose_shed_task_yields_after_its_continuation_started_elsewhere_is_told():
    """The yield and the continuation reach the scheduler on separate connections, in either order."""
    async def go():
        plugin = _plugin()
        _move(plugin, "b", "no-worker", "processing", "D")
        _move(plugin, "a", "no-worker", "processing", "W")
        plugin.book.on_parked([RolloutTask("a-resume1", 4, 1)], 0.0, "t")
        _move(plugin, "a-resume1", "no-worker", "processing", "D")
        w = asyncio.ensure_future(plugin._h_keys_done(keys=["a", "b"], worker="W"))
        await asyncio.sleep(0)
        before = w.done()
        plugin._h_yielded(key="a", worker="W")
        return before, await asyncio.wait_for(w, 1)

    assert asyncio.run(go()) == (False, {"waited_for": 2})
