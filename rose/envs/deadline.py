"""Calling environment code under a deadline (`EngineConfig.env_timeout_s`).

Environments are user code and mostly synchronous. A `reset` or `step` that hangs (a stuck tool, a
sandbox that never answers) cannot be cancelled: Python has no way to stop a thread or a sync call
from outside. So every call runs in a thread of its own and the rollout waits for it at most
`timeout_s`; past that the rollout fails the trajectory and walks away, and the thread is abandoned
to finish, or not, on its own. On the event loop instead, a hung call would freeze every rollout of
the worker and the worker's heartbeats with them.

Calls run on a pool of daemon threads that grows whenever no thread is idle, not on a fixed-size
pool: a hung call holds its thread, and later calls must not queue behind it; and daemon threads, not
a ThreadPoolExecutor, which joins its threads at interpreter exit and so would keep a worker with a hung
call from ever exiting. Threads idle for `IDLE_EXIT_S` exit. (A fresh thread per call cost about 1 ms
here against 0.1 ms for a pooled one: per environment turn, on every trajectory.)
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any, Callable

logger = logging.getLogger("rose.envs")

IDLE_EXIT_S = 60.0  # a pool thread with no call for this long exits (s)

_lock = threading.Lock()
_abandoned = 0  # calls past their deadline whose thread still runs
_jobs: queue.SimpleQueue = queue.SimpleQueue()
# Pool threads waiting for a job minus jobs queued (changed under _lock with every put): > 0 means a
# new job will find an idle thread.
_idle = 0


def _submit(job: Callable[[], None]) -> None:
    global _idle
    with _lock:
        _jobs.put(job)
        if _idle > 0:
            _idle -= 1
            return
    threading.Thread(target=_work, name="rose-env", daemon=True).start()


def _work() -> None:
    global _idle
    while True:
        try:
            job = _jobs.get(timeout=IDLE_EXIT_S)
        except queue.Empty:
            with _lock:
                if _jobs.empty():  # no job was promised to this thread: leave
                    _idle -= 1
                    return
            continue
        job()
        with _lock:
            _idle += 1


class DeadlineExceeded(TimeoutError):
    """An environment call did not return in time (its own TimeoutErrors are not this)."""


def abandoned_calls() -> int:
    """Environment calls that passed their deadline and still hold a thread in this process."""
    return _abandoned


async def call_with_deadline(fn: Callable[..., Any], *args, timeout_s: float, name: str = "rose-env") -> Any:
    """Run `fn(*args)` on a pool thread; return its result or raise its exception. Raises
    `DeadlineExceeded` when it has not returned after `timeout_s` seconds (the thread is left running)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    state = {"abandoned": False, "finished": False}  # guarded by _lock

    def settle(out: tuple) -> None:
        if not fut.done():  # wait_for cancelled it at the deadline: nobody waits for the result
            fut.set_result(out)

    def run() -> None:
        global _abandoned
        try:
            out = (True, fn(*args))
        except StopIteration as e:  # raised in a coroutine it would become "coroutine raised StopIteration"
            out = (False, RuntimeError(f"StopIteration: {e}"))
        except Exception as e:
            out = (False, e)
        except BaseException as e:  # SystemExit and friends from user code: a failure of this call only
            out = (False, RuntimeError(f"{type(e).__name__}: {e}"))
        with _lock:
            state["finished"] = True
            if state["abandoned"]:
                _abandoned -= 1
                return
        try:
            loop.call_soon_threadsafe(settle, out)
        except RuntimeError:  # the event loop closed meanwhile
            pass

    _submit(run)
    # The call's outcome travels as a value: its own exceptions (a TimeoutError of a tool, which is
    # asyncio's TimeoutError too) must not pass for the deadline.
    try:
        ok, value = await asyncio.wait_for(fut, timeout_s)
    except asyncio.TimeoutError:
        global _abandoned
        with _lock:
            if not state["finished"]:
                state["abandoned"] = True
                _abandoned += 1
            n = _abandoned
        logger.warning("%s did not return within %g s; its thread is abandoned (%d in this process)", name,
                       timeout_s, n)
        raise DeadlineExceeded(f"no return within {timeout_s:g} s") from None
    if not ok:
        raise value
    return value
