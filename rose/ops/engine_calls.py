"""How a rollout talks to its worker's engine: one policy turn (retried where an engine iteration failed
under it, under its deadline), and a whole group run on the engine's own event loop, with a watchdog
for an engine that stalls.

Both rollout engines run an asyncio loop on the thread that steps their engines (a dedicated worker's
`EngineLoop`, rose/runtime/engine/loop.py; a serving worker's `CoServingExecutor`): a group's agent loops
run there, so their turns never cross threads.
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
from rose.runtime.engine.base import SamplingSpec
from rose.runtime.engine.deadlines import timeout_message
from rose.runtime.trajectory import Trajectory


ENGINE_RETRIES = 3  # times a turn is sent again after an engine iteration failed under it


async def generate_turn(engine, prompt: list[int], sampling: SamplingSpec, request_id: str, timeout_s: float):
    """One policy turn. An engine iteration that fails fails every request in it; each of those is
    sent again (same prompt, same seed) rather than failing its trajectory. A request the engine
    refuses on its own account (too long, bad tokens) is not retried; one not answered in `timeout_s`
    fails with that reason."""
    here = getattr(engine, "on_loop", None)
    here = here is not None and here()  # this rollout runs on the engine's own loop: no thread crossed
    # An engine loop that keeps the turn's deadline itself spares the turn a timer (engine/deadlines.py)
    keeps = here and getattr(engine, "keeps_deadlines", False)
    for attempt in range(ENGINE_RETRIES + 1):
        try:
            if keeps:
                return await engine.agenerate(prompt, sampling, request_id=request_id, timeout_s=timeout_s)
            fut = engine.agenerate(prompt, sampling, request_id=request_id) if here else \
                asyncio.wrap_future(engine.generate(prompt, sampling, request_id=request_id))
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError:
            raise EngineError(timeout_message(timeout_s), request_id=request_id) from None
        except EngineError as e:
            if not e.context.get("retryable") or attempt == ENGINE_RETRIES:
                raise


async def on_engine_loop(engine, make: Callable[[], Awaitable], stall_s: float,
                         handed: Callable[[], None] = lambda: None):
    """Await `make()` (an awaitable, made on the loop it runs on) on the engine's own event loop where
    it has one, else here. Raises EngineError when the engine has requests waiting and has finished no
    iteration for `stall_s` seconds. Cancelling this cancels it there. `handed()` is called once the
    work is on its way to that loop (an idle engine's first iteration waits for it: engine/loop.py)."""
    run = getattr(engine, "run", None)
    if run is None:
        handed()
        return await make()

    async def there():
        return await make()

    fut = asyncio.wrap_future(run(there()))
    handed()
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


def failed_group(specs, states, e: Exception, w) -> list[Trajectory]:
    """The group's rows when its run failed as a whole (on worker `w`): trajectories finished before (a
    resumed group's) as they were, every other one failed with `e`, its turns so far (a `Partial`'s) kept."""
    out = []
    for spec, state in zip(specs, states):
        if isinstance(state, Trajectory):
            out.append(state)
            continue
        traj = state.traj if state is not None else spec.trajectory()
        traj.finish_reason, traj.error = "failed", f"{type(e).__name__}: {e}"
        out.append(stamp(traj, w))
    return out


def stamp(traj: Trajectory, w) -> Trajectory:
    """`traj`, recorded as run on worker `w`: its address, and whether its engine was dedicated or
    co-served beside a serving model."""
    traj.worker, traj.placement = w.address, "dedicated" if w.role == "dedicated" else "serving"
    return traj
