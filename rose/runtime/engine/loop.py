"""One thread that owns an engine and steps it; rollout tasks hand it requests and wait on futures.

Why a loop: vLLM is fast only when many requests meet in one batch. Rollout tasks run in many Dask
threads and mostly wait; each turn's request goes through a command queue to this thread, which adds
it to the engine and steps the engine while any request is unfinished. Everything that touches the
engine (add, step, abort, weight loads) happens on this thread, between iterations, so the engine
is never used concurrently and a weight swap never lands in the middle of an iteration.
"""
from __future__ import annotations

import itertools
import logging
import time
from concurrent.futures import Future
from typing import Callable

from rose.errors import EngineError
from rose.runtime.engine.base import Engine, SamplingSpec
from rose.runtime.engine.batching import BatchHold, hold_s
from rose.runtime.engine.pending import PendingRollout, absorb, engine_future, fail
from rose.runtime.engine.thread import CommandThread, build

logger = logging.getLogger("rose.engine")


class EngineLoop(CommandThread):
    """Steps `engine` on a daemon thread: a `RolloutEngine`. Thread-safe: call from any thread."""

    def __init__(self, engine: Engine | Callable[[], Engine], name: str = "rose-engine-loop",
                 cores: tuple[int, ...] | None = None, hold: BatchHold | None = None):
        """`engine` is an Engine, or a function that builds one: then it is built on the loop thread,
        so that the engine's per-thread settings (vLLM's CPU thread binding, OpenMP thread count)
        apply to the thread that runs its kernels. `hold`: when to wait for the turns about to come
        back before stepping (rose/runtime/engine/batching.py); None steps at once."""
        self._engine_or_factory = engine
        self._hold_cfg = hold
        self._last_batch = 0  # requests pending when the last iteration began
        self._step_end = 0.0  # perf_counter seconds when it ended
        self._last_arrival: float | None = None  # perf_counter seconds of the latest request since then
        self.engine: Engine | None = None
        self._pending: dict[str, PendingRollout] = {}  # by engine request id; owned by the loop thread
        self._ids = itertools.count()
        # Counters (written by the loop thread only).
        self.iterations = 0  # engine steps
        self.rollout_tokens = 0  # tokens generated
        self.busy_s = 0.0  # seconds spent inside engine.step()
        self._start(name, cores)

    # ---------------------------------------------------------------- public API (any thread)
    def generate(self, prompt_token_ids: list[int], spec: SamplingSpec, request_id: str | None = None) -> Future:
        """Queue one request; the future resolves to a `Generation` (or raises, e.g. prompt too long)."""
        rid = f"{request_id or 'req'}#{next(self._ids)}"  # unique even when a caller retries an id
        return self._submit("add", (rid, list(prompt_token_ids), spec))

    def load_weights(self, named_tensors: dict, version: int) -> Future:
        """Swap all weights between two iterations, once the requests in flight have finished (their
        tokens keep one version; requests queued after the swap wait for it); resolves once the
        engine holds `version`."""
        return self._submit("load", (named_tensors, version))

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def counters(self) -> dict[str, float]:
        return {"rollout_steps": self.iterations, "rollout_tokens": self.rollout_tokens, "busy_s": self.busy_s}

    def _submit(self, kind: str, payload) -> Future:
        fut = engine_future()
        self._command(kind, (payload, fut))
        return fut

    # ---------------------------------------------------------------- loop thread
    def _build(self) -> None:
        self.engine = build(self._engine_or_factory)

    def _has_work(self) -> bool:
        return bool(self._pending)

    def _work(self) -> None:
        self._step()

    def _closing(self) -> None:
        fail(self._pending.values(), "engine loop closed with the request unfinished")
        self._pending.clear()

    def _drop(self, kind: str, payload, reason: str) -> None:
        payload[1].set_exception(EngineError(reason))

    def _apply(self, kind: str, payload) -> bool:
        payload, fut = payload
        if kind == "load" and self._pending:
            logger.info("weight load to version %s waits for %d requests in flight", payload[1], len(self._pending))
            return False
        try:
            if kind == "add":
                rid, prompt, spec = payload
                self.engine.add_request(rid, prompt, spec)
                self._pending[rid] = PendingRollout(rid, fut)
                self._last_arrival = time.perf_counter()
            elif kind == "load":
                named, version = payload
                self.engine.load_weights(named, version)
                fut.set_result(version)
        except Exception as e:  # the caller's request was bad; the loop keeps serving others
            fut.set_exception(e)
        return True

    def _hold(self) -> float:
        if self._hold_cfg is None:
            return 0.0
        now = time.perf_counter()
        since = None if self._last_arrival is None else now - self._last_arrival
        return hold_s(self._hold_cfg, len(self._pending), self._last_batch, now - self._step_end, since)

    def _step(self) -> None:
        self._last_batch = len(self._pending)
        t0 = time.perf_counter()
        try:
            outputs = self.engine.step()
        except Exception as e:
            logger.exception("engine step failed; failing %d requests", len(self._pending))
            fail(self._pending.values(), f"engine step failed: {e}", retryable=True)
            self.engine.abort(list(self._pending))
            self._pending.clear()
            return
        now = time.perf_counter()
        self._step_end, self._last_arrival = now, None
        self.busy_s += now - t0
        self.iterations += 1
        self.rollout_tokens += absorb(self._pending, outputs, self.engine.weight_version, now)
