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
from dataclasses import dataclass, field
from typing import Callable

from rose.errors import EngineError
from rose.runtime.engine.base import Engine, SamplingSpec
from rose.runtime.engine.thread import CommandThread, build

logger = logging.getLogger("rose.engine")


@dataclass
class Generation:
    """The result of one request: the new tokens with their behaviour log-probs and versions."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)  # engine weight version per token
    finish_reason: str | None = None  # stop | length | abort
    queue_s: float = 0.0  # submit -> first token
    total_s: float = 0.0  # submit -> finished

    def absorb(self, out, version: int, now: float, t_submit: float) -> None:
        """Append one engine iteration's new tokens (an EngineOutput) made at weights `version`."""
        if out.token_ids and not self.token_ids:
            self.queue_s = now - t_submit
        self.token_ids += out.token_ids
        self.logprobs += out.logprobs
        self.weight_versions += [version] * len(out.token_ids)


@dataclass
class _Pending:
    future: Future
    gen: Generation
    t_submit: float


class EngineLoop(CommandThread):
    """Steps `engine` on a daemon thread. Thread-safe: call from any thread."""

    def __init__(self, engine: Engine | Callable[[], Engine], name: str = "rose-engine-loop",
                 cores: tuple[int, ...] | None = None):
        """`engine` is an Engine, or a function that builds one: then it is built on the loop thread,
        so that the engine's per-thread settings (vLLM's CPU thread binding, OpenMP thread count)
        apply to the thread that runs its kernels."""
        self._engine_or_factory = engine
        self.engine: Engine | None = None
        self._pending: dict[str, _Pending] = {}  # owned by the loop thread
        self._ids = itertools.count()
        # Counters read by reports and benchmarks (written by the loop thread only).
        self.iterations = 0
        self.generated_tokens = 0
        self.busy_s = 0.0  # seconds spent inside engine.step()
        self._start(name, cores)

    # ---------------------------------------------------------------- public API (any thread)
    def generate(self, prompt_token_ids: list[int], spec: SamplingSpec, request_id: str | None = None,
                 priority: int = 0) -> Future:
        """Queue one request; the future resolves to a `Generation` (or raises, e.g. prompt too long)."""
        rid = f"{request_id or 'req'}#{next(self._ids)}"  # unique even when a caller retries an id
        return self._submit("add", (rid, list(prompt_token_ids), spec, priority))

    def load_weights(self, named_tensors: dict, version: int) -> Future:
        """Swap all weights between two iterations, once the requests in flight have finished (their
        tokens keep one version; requests queued after the swap wait for it); resolves once the
        engine holds `version`."""
        return self._submit("load", (named_tensors, version))

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def _submit(self, kind: str, payload) -> Future:
        fut: Future = Future()
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
        for p in self._pending.values():
            p.future.set_exception(EngineError("engine loop closed with the request unfinished"))
        self._pending.clear()

    def _apply(self, kind: str, payload) -> bool:
        payload, fut = payload
        if kind == "load" and self._pending:
            logger.info("weight load to version %s waits for %d requests in flight", payload[1], len(self._pending))
            return False
        try:
            if kind == "add":
                rid, prompt, spec, priority = payload
                self.engine.add_request(rid, prompt, spec, priority)
                self._pending[rid] = _Pending(fut, Generation(), time.perf_counter())
            elif kind == "load":
                named, version = payload
                self.engine.load_weights(named, version)
                fut.set_result(version)
        except Exception as e:  # the caller's request was bad; the loop keeps serving others
            fut.set_exception(e)
        return True

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            outputs = self.engine.step()
        except Exception as e:
            logger.exception("engine step failed; failing %d requests", len(self._pending))
            for rid, p in self._pending.items():
                p.future.set_exception(EngineError(f"engine step failed: {e}", request_id=rid))
            self.engine.abort(list(self._pending))
            self._pending.clear()
            return
        now = time.perf_counter()
        self.busy_s += now - t0
        self.iterations += 1
        version = self.engine.weight_version
        for out in outputs:
            p = self._pending.get(out.request_id)
            if p is None:
                continue
            if out.error is not None:
                del self._pending[out.request_id]
                p.future.set_exception(EngineError(out.error, request_id=out.request_id))
                continue
            g = p.gen
            g.absorb(out, version, now, p.t_submit)
            self.generated_tokens += len(out.token_ids)
            if out.finished:
                g.finish_reason = out.finish_reason
                g.total_s = now - p.t_submit
                del self._pending[out.request_id]
                p.future.set_result(g)
