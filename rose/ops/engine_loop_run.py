"""Running a rollout group on the engine's own event loop, with a watchdog for an engine that stalls.

A dedicated worker's `EngineLoop` runs an asyncio loop on the thread that steps its engine
(rose/runtime/engine/loop.py): a group's agent loops run there, so their turns never cross threads.
The price: while one engine iteration runs, nothing else on that thread does, a turn's own deadline
(`request_timeout_s`) included. An iteration that never returns (a hung kernel, a deadlock in the
engine) would then hold the group forever; the Dask task, on the worker's own loop, watches for it
and fails the group's unfinished trajectories with the reason instead (nothing lost; the engine's
thread is beyond saving and the worker's later groups fail the same way, in the same time).
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from rose.errors import EngineError


async def on_engine_loop(engine, make: Callable[[], Awaitable], stall_s: float):
    """Await `make()` (an awaitable, made on the loop it runs on) on the engine's own event loop where
    it has one, else here. Raises EngineError when the engine has requests waiting and has finished no
    iteration for `stall_s` seconds. Cancelling this cancels it there."""
    run = getattr(engine, "run", None)
    if run is None:
        return await make()

    async def there():
        return await make()

    fut = asyncio.wrap_future(run(there()))
    try:
        while True:
            done, _ = await asyncio.wait({fut}, timeout=stall_s)
            if done:
                return fut.result()
            stalled = engine.stalled_s()
            if stalled >= stall_s:
                fut.cancel()  # lands when (if) the engine's thread comes back
                raise EngineError(f"the engine has finished no iteration in {stalled:.0f} s with requests waiting "
                                  f"(request_timeout_s={stall_s:g}); its thread is stuck")
    except asyncio.CancelledError:
        fut.cancel()
        raise
