"""The co-serving executor's two engine steps, each timed, fed to its latency model and routed.

Each step's wall time and its thread's CPU time are counted apart (`stats`: *_wall_ms, *_cpu_ms): the
difference is what the core gave to other threads and processes inside the executor's own steps. A
step that raises fails only the requests in that engine, and the executor goes on: serving requests
with the reason, rollout requests as retryable (the agent loop sends them again).
"""
from __future__ import annotations

import logging
import time

from rose.runtime.coserve.serving_request import deliver, fail_all
from rose.runtime.engine.pending import absorb, fail

logger = logging.getLogger("rose.coserve")


def step_serving(ex, planned_tokens: int, admitted: int, prefill: int) -> float:
    """One step of `ex`'s serving engine, planned at `planned_tokens`; returns its ms."""
    t0, c0 = time.perf_counter(), time.thread_time()
    outs = _step(ex.serving, "serving", ex._serving_reqs, lambda why: fail_all(ex._serving_reqs, why))
    t1 = _timed(ex.stats, "serving" if outs is not None else None, t0, c0)
    if outs is not None:
        ex.controller.serving_model.observe(planned_tokens, (t1 - t0) * 1e3, admitted, prefill)
        ex.stats["serving_tokens"] += deliver(ex._serving_reqs, outs, t1)
    return (t1 - t0) * 1e3


def step_rollout(ex, seqs: int, admitted: int = 0, context: int = 0) -> float:
    """One step of `ex`'s rollout engine, `seqs` sequences decoding, `admitted` of them new with `context`
    prompt tokens between them; returns its ms."""

    def failed(why: str) -> None:
        requests = list(ex._running.values())
        ex._running.clear()
        fail(requests, why, retryable=True)

    t0, c0 = time.perf_counter(), time.thread_time()
    outs = _step(ex.rollout, "rollout", ex._running, failed)
    t1 = _timed(ex.stats, "rollout" if outs is not None else None, t0, c0)
    if outs is not None:
        ex.controller.rollout_model.observe(seqs, (t1 - t0) * 1e3, admitted, context)
        ex.stats["rollout_steps"] += 1
        before = len(ex._running)
        ex.stats["rollout_tokens"] += absorb(ex._running, outs, ex.rollout.weight_version, t1)
        ex.stats["rollout_requests"] += before - len(ex._running)
    return (t1 - t0) * 1e3


def _step(engine, kind: str, requests: dict, failed) -> list | None:
    """`engine.step()`'s outputs; None where it raised, after aborting `requests` in it and failing them."""
    try:
        return engine.step()
    except Exception as e:
        logger.exception("%s engine step failed; failing %d %s requests", kind, len(requests), kind)
        engine.abort(list(requests))
        failed(f"{kind} engine step failed: {e}")
        return None


def _timed(stats: dict, kind: str | None, t0: float, c0: float) -> float:
    """Now (perf_counter seconds); counts the step begun at `t0` (thread CPU `c0`) as `kind`'s (None: not)."""
    t1 = time.perf_counter()
    if kind is not None:
        stats[f"{kind}_wall_ms"] += (t1 - t0) * 1e3
        stats[f"{kind}_cpu_ms"] += (time.thread_time() - c0) * 1e3
    return t1
