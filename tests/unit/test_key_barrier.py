"""The scheduler's wait for tasks to end (`rose_keys_done`), without processes: what counts as ended,
and a cancelled wait leaves nothing behind."""
import asyncio
from types import SimpleNamespace

import pytest

from rose.runtime.scheduler.barrier import KeyBarrier
from rose.runtime.scheduler.plugin import RoseScheduler


def _tasks(**states):
    return {k: SimpleNamespace(state=v) for k, v in states.items()}


def test_keys_already_ended_or_unknown_do_not_wait():
    async def go():
        b = KeyBarrier()
        n = await asyncio.wait_for(b.wait(_tasks(a="memory", b="erred"), ["a", "b", "gone"]), 1)
        return n, b.calls, b.waited, len(b)

    assert asyncio.run(go()) == (0, 1, 0, 0)


def test_a_wait_ends_once_every_key_has_ended_and_not_before():
    async def go():
        b, tasks = KeyBarrier(), _tasks(a="processing", b="no-worker", c="memory")
        waiter = asyncio.ensure_future(b.wait(tasks, ["a", "b", "c"]))
        await asyncio.sleep(0)
        seen = []
        # a retry (its worker left) and a task still waiting for a worker have not ended
        for key, state in (("a", "released"), ("a", "waiting"), ("b", "processing"), ("a", "memory")):
            b.transition(key, state)
            await asyncio.sleep(0)
            seen.append(waiter.done())
        b.transition("b", "erred")  # a failed task has ended too
        n = await asyncio.wait_for(waiter, 1)
        return seen, n, len(b), b.waited

    seen, n, left, waited = asyncio.run(go())
    assert seen == [False, False, False, False]
    assert n == 2 and left == 0 and waited == 1


def test_two_callers_on_one_key_both_return_and_a_forgotten_key_counts_as_ended():
    async def go():
        b, tasks = KeyBarrier(), _tasks(a="processing")
        w1 = asyncio.ensure_future(b.wait(tasks, ["a"]))
        w2 = asyncio.ensure_future(b.wait(tasks, ["a"]))
        await asyncio.sleep(0)
        b.transition("a", "forgotten")
        return await asyncio.wait_for(asyncio.gather(w1, w2), 1), len(b)

    assert asyncio.run(go()) == ([1, 1], 0)


def test_a_cancelled_wait_leaves_no_key_registered():
    async def go():
        b, tasks = KeyBarrier(), _tasks(a="processing", b="processing")
        waiter = asyncio.ensure_future(b.wait(tasks, ["a", "b"]))
        await asyncio.sleep(0)
        b.transition("a", "memory")
        registered = len(b)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return registered, len(b), "b" in b

    assert asyncio.run(go()) == (1, 0, False)


def test_the_plugin_feeds_its_barrier_for_tasks_it_does_not_place():
    """The sync waits on the next step's rollout keys; the hook must reach the barrier before its own
    filter (a key the book no longer holds, or never held, is still waited on)."""
    async def go():
        plugin = RoseScheduler()
        plugin.scheduler = SimpleNamespace(tasks=_tasks(r="processing"), workers={}, loop=None)
        waiter = asyncio.ensure_future(plugin._h_keys_done(keys=["r"]))
        await asyncio.sleep(0)
        plugin.transition("r", "processing", "memory", stimulus_id="t")
        b = plugin.barrier
        return await asyncio.wait_for(waiter, 1), plugin.errors, (b.calls, b.waited, len(b))

    reply, errors, barrier = asyncio.run(go())
    assert reply == {"waited_for": 1} and errors == 0
    assert barrier == (1, 1, 0)
