"""The co-serving executor: a serving engine and a rollout engine stepped by one thread.

Every iteration it asks the `SloController` for a plan and applies it: preempt the rollout sequences
the plan names (abort them in the engine, keep their tokens), admit the ones it allows, step the
serving engine, then the rollout engine as many times as the plan says (a period that has used its
budget as measured cuts the extra steps short, and so does a serving request that arrives meanwhile
if waiting the period out would take it past its TTFT guard: `SloController.first_token_can_wait`).
Each step's measured time feeds the controller's latency model. A preempted rollout sequence later
resumes from its prompt plus the tokens it had, as a new engine request for what is left; its caller
sees one `Generation`. Rollout callers see a `RolloutEngine`, as on a dedicated worker, so the agent
loop runs unchanged on a serving worker; a rollout group's agent loops run on the executor's own thread
between its iterations (`run`, `agenerate`; the thread's asyncio loop: thread.py), as on a dedicated
worker's engine loop, rather than on the worker's event loop, where they took their turns inside the
executor's steps. Weight loads reach the rollout engine only (never the serving model), in slices that
fit the TPOT budget, between serving steps (`swaps.py`). The controller sees both engines' real KV
caches (vLLM's block pools) every iteration (`views.py`).
"""
from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable

from rose.errors import EngineError
from rose.runtime.coserve.backlog import OfferBound
from rose.runtime.coserve.rollout_request import RolloutRequest as _Rollout
from rose.runtime.coserve.serving_request import ServingRequest
from rose.runtime.coserve.slo import SloController
from rose.runtime.coserve.steps import step_rollout, step_serving
from rose.runtime.coserve.swaps import RolloutSwaps
from rose.runtime.coserve.views import rollout_view, serving_view
from rose.runtime.engine.base import Engine, SamplingSpec
from rose.runtime.engine.pending import engine_future, fail, settle
from rose.runtime.engine.thread import CommandThread, build, warm_up


class CoServingExecutor(CommandThread):
    """A `RolloutEngine` that also serves online requests (`serve`). Thread-safe: call from any thread."""

    def __init__(self, serving: Engine | Callable[[], Engine], rollout: Engine | Callable[[], Engine] | None,
                 controller: SloController, cores: tuple[int, ...] | None = None, name: str = "rose-coserve",
                 build_off_thread: bool = False, staged_loads: bool = True):
        """Engines (or functions that build them, on the executor's thread). `rollout` may come later
        (`attach_rollout`). `build_off_thread`, `staged_loads`: see `RolloutSwaps`."""
        self.controller = controller
        self._factories = (serving, rollout)
        self.swaps = RolloutSwaps(self, build_off_thread, staged_loads)
        self.serving: Engine | None = None
        self.rollout: Engine | None = None
        self._ids, self._admissions = itertools.count(), itertools.count(1)  # request ids; admission order
        self._serving_reqs: dict[str, ServingRequest] = {}  # loop thread only
        self._waiting: list[_Rollout] = []  # not in the engine: new or preempted, in order
        self._running: dict[str, _Rollout] = {}  # in the engine, by engine request id
        # State changes with their cause, newest last: (iteration, kind, request id or version, cause).
        self.events: deque = deque(maxlen=2000)
        self._asleep = False  # the rollout engine gave its device memory back (GPU co-serving)
        self.broken: str | None = None  # a rollout weight load failed: why rollout work fails from then on
        self._waited = 0  # iterations in a row with rollout sequences running but not stepped
        self._last_serving_step = None  # the last iteration with a serving step: (start, its ms, rollout ms, predicted)
        # Counters (loop thread). steps_cut: iterations whose extra rollout steps the measured period cut short;
        # admitted_between: requests admitted before extra steps; *_wall_ms - *_cpu_ms: contention mid-step.
        self.stats = dict.fromkeys(("iterations", "preemptions", "rollout_tokens", "rollout_requests",
                                    "serving_tokens", "rollout_steps", "load_slices", "steps_cut", "admitted_between",
                                    "rollout_wall_ms", "rollout_cpu_ms", "serving_wall_ms", "serving_cpu_ms"), 0)
        self.last_plan = None
        # Serving requests decoding or about to (a peak halving in ~35 iterations): what the rollout capacity
        # offered leaves room for. Not prefill tokens: the running batch waits a prefill out (rollout_waits).
        self._serving_peak = 0.0
        # The offer's other bound: the trajectories this device keeps moving (backlog.py). `in_flight`: what
        # the placement counts here (the host sets it; alone, the executor counts its own requests).
        self.offer_bound = OfferBound()
        self.in_flight: Callable[[], int] = lambda: len(self._running) + len(self._waiting)
        # Serving requests handed in (any thread) and taken into the serving engine (loop thread): a
        # difference is a request waiting in the command queue, which ends extra rollout steps
        self._serves_sent = self._serves_applied = 0
        self._beat = 0.0  # perf_counter seconds of the last iteration's end (or rollout work reaching an idle executor)
        self._start(name, cores)

    # ---------------------------------------------------------------- any thread
    def generate(self, prompt_token_ids: list[int], spec: SamplingSpec, request_id: str | None = None) -> Future:
        """Rollout work: resolves to a `Generation`, however often it was preempted on the way."""
        rid = f"{request_id or 'rollout'}#{next(self._ids)}"
        r = _Rollout(rid, engine_future(), prompt=list(prompt_token_ids), spec=spec)
        self._command("rollout", r)
        return r.future

    def agenerate(self, prompt_token_ids: list[int], spec: SamplingSpec,
                  request_id: str | None = None) -> asyncio.Future:
        """`generate` for a caller on the executor's own thread (`on_loop()`: a rollout group run there with
        `run`): an asyncio future, resolved without crossing threads. A caller that stops waiting cancels
        only its future; the request finishes in the engine and its result is dropped."""
        r = _Rollout(f"{request_id or 'rollout'}#{next(self._ids)}", self.aio.create_future(),
                     prompt=list(prompt_token_ids), spec=spec)
        if self._closed:
            settle(r.future, EngineError(f"{self._thread.name} is closed", request_id=r.request_id))
        else:
            self._apply("rollout", r)
            self._schedule()
        return r.future

    def serve(self, prompt_token_ids: list[int], spec: SamplingSpec, request_id: str | None = None,
              on_delta: Callable | None = None) -> ServingRequest:
        """Online work: always admitted to the serving engine; tokens arrive through `on_delta` or
        the request's `deltas` queue."""
        req = ServingRequest(f"{request_id or 'serve'}#{next(self._ids)}", len(prompt_token_ids), on_delta=on_delta)
        self._serves_sent += 1  # before the command: the loop never sees it applied but not sent
        self._command("serve", (req, list(prompt_token_ids), spec))
        return req

    def abort_serving(self, request_id: str) -> None:
        self._command("abort", request_id)

    def attach_rollout(self, rollout: Engine | Callable[[], Engine]) -> Future:
        """Give the executor its rollout engine (a function that builds one runs on the executor's thread,
        or its own with `build_off_thread`); resolves once the executor steps it."""
        return self.swaps.attach(rollout)

    @property
    def rollout_capacity(self) -> int:
        """Rollout sequences this device can run next to its recent serving load inside the SLO (the
        slots it reports to the scheduler; 0 without a usable rollout engine or while it sleeps)."""
        if self.rollout is None or self._asleep or self.broken:
            return 0
        return self.offer_bound.bound(self.controller.rollout_capacity(int(self._serving_peak + 0.999)))

    def load_weights(self, named_tensors: dict, version: int) -> Future:
        """Swap the rollout engine's weights (never the serving engine's) between iterations, once no
        rollout request is in flight; rollout requests queued after the swap wait for it. Staged on a
        thread of its own, applied in slices between serving iterations."""
        return self.swaps.load(named_tensors, version)

    @property
    def weight_version(self) -> int:  # -1: no rollout engine yet
        return self.rollout.weight_version if self.rollout is not None else -1

    def counters(self) -> dict[str, float]:
        return dict(self.stats)

    def stalled_s(self) -> float:
        """Seconds since the last iteration ended (or rollout work reached an idle executor) while rollout
        requests wait or run; 0 when none does. A watchdog's reading: the thread may be stuck."""
        if not (self._running or self._waiting or self.swaps.held):
            return 0.0
        return time.perf_counter() - self._beat

    # ---------------------------------------------------------------- loop thread
    def _build(self) -> None:
        s, r = self._factories
        self.serving = warm_up(build(s))
        self.rollout = warm_up(build(r))

    def _has_work(self) -> bool:
        return bool(self._serving_reqs or self._waiting or self._running or self.swaps.ready)

    def _closing(self) -> None:
        held = self.swaps.close("co-serving executor closed before the weight load applied")
        fail([*self._running.values(), *self._waiting, *held], "co-serving executor closed with the request unfinished")

    def _drop(self, kind: str, payload, reason: str) -> None:
        if kind == "rollout":
            settle(payload.future, EngineError(reason))
        elif kind == "serve":
            payload[0].emit([], True, f"error: {reason}")
        elif kind in ("attach", "attached", "load"):
            payload[-1].set_exception(EngineError(reason))

    def _apply(self, kind, payload) -> None:
        if kind == "rollout":
            if not (self._running or self._waiting):
                self._beat = time.perf_counter()  # the watchdog counts from here
            if self.rollout is None or self.broken:
                settle(payload.future, EngineError(self.broken or "this serving worker has no rollout engine yet "
                                                   "(no run has prepared it)", request_id=payload.request_id))
            elif self.swaps.pending:  # a weight load comes first
                self.swaps.held.append(payload)
            else:
                self._waiting.append(payload)
        elif kind in ("attach", "attached", "load"):
            self.swaps.apply(kind, payload)
        elif kind == "serve":
            self._serves_applied += 1
            req, prompt, spec = payload
            try:
                self.serving.add_request(req.request_id, prompt, spec)
            except Exception as e:  # a bad request fails alone; the executor goes on
                req.emit([], True, f"error: {e}")
                return
            self._serving_reqs[req.request_id] = req
        elif kind == "abort":
            if self._serving_reqs.pop(payload, None) is not None:
                self.serving.abort([payload])
        # "wake" (a weight load staged): nothing to apply; the thread looks at its work again

    def _work(self) -> float:  # one iteration; returns the seconds to wait before the next
        t_work = time.perf_counter()
        serving = serving_view(self.serving, self._serving_reqs.values(), t_work)
        rollout = rollout_view(self.rollout, self._running, self._waiting, self._asleep, self._waited)
        plan = self.controller.plan(serving, rollout)
        self.last_plan = plan
        decodes = serving.decoding + len(serving.waiting_prompt_tokens)
        self._serving_peak = max(float(decodes), self._serving_peak * 0.98)
        causes = plan.notes.get("preempt_causes", {})
        for eid in plan.rollout_preempt:
            r = self._running.pop(eid)
            self.rollout.abort([eid])
            r.engine_id = None
            self._waiting.insert(0, r)  # first to resume
            self.stats["preemptions"] += 1
            self.events.append((self.stats["iterations"], "preempt", r.request_id, causes.get(eid, plan.reason)))
        if plan.rollout_sleep is True and not self._asleep:
            self.rollout.sleep()
            self._asleep = True
        elif plan.rollout_sleep is False and self._asleep:
            self.rollout.wake_up()
            self._asleep = False
        admitted, context = self._admit_ids(plan.rollout_admit)  # requests put in the engine, their context
        if (self._running or self._waiting) and not self.swaps.pending:
            self.offer_bound.observe(self.in_flight(), len(self._waiting), admitted)
        self.stats["iterations"] += 1
        serving_ms = rollout_ms = 0.0
        predicted = plan.serving_ms + self.controller.overhead_ms  # this iteration's period, as planned (ms)
        t_start = time.perf_counter()
        if self._serving_reqs:
            serving_ms = step_serving(self, plan.serving_tokens, plan.serving_admits, plan.serving_prefill)
        if self.swaps.due:
            # A load slice takes the rollout step's place: the time serving leaves this iteration, and no
            # more with no serving request, so one that arrives meanwhile waits one slice at most.
            cap = self.controller.slo.tpot_ms * (1 - self.controller.margin)
            rollout_ms = self.swaps.advance(min(plan.budget_ms - serving_ms + plan.serving_ms, cap))
            predicted = None  # a load slice has no step prediction to check
        elif plan.rollout_step and self._running:
            rollout_ms = step_rollout(self, len(self._running), admitted, context)
            predicted += plan.rollout_ms
            # More decode steps where the plan found them room; a serving request arriving ends them. Each is
            # checked against the period's time so far, as measured: a step slower than predicted takes its
            # overrun out of the steps after it, not out of the TPOT, so errors do not add up over many steps.
            # Waiting sequences join where the time left holds them (not after a preempting plan: that is serving's).
            limit_ms = plan.budget_ms + plan.serving_ms  # the period's budget, from the serving step's start
            admit_more = self._waiting and not plan.rollout_preempt
            for _ in range(plan.rollout_steps - 1):
                left_ms = limit_ms - (time.perf_counter() - t_start) * 1e3
                waited_ms = self._first_token_wait_ms(t_work)
                if not self._running or (waited_ms is not None
                                         and not self.controller.first_token_can_wait(waited_ms, left_ms)):
                    break
                admitted = context = 0
                if admit_more and self._waiting:
                    view = rollout_view(self.rollout, self._running, self._waiting, self._asleep, self._waited)
                    admitted, context = self._admit_ids(self.controller.admit_between(view, left_ms))
                    self.stats["admitted_between"] += admitted
                step_ms = self.controller.rollout_model.predict(len(self._running), admitted, context)
                if step_ms > left_ms:
                    self.stats["steps_cut"] += 1
                    break
                predicted += step_ms
                rollout_ms += step_rollout(self, len(self._running), admitted, context)
        self._waited = 0 if rollout_ms or not self._running else self._waited + 1
        # The period a decoding serving request sees: from one serving step to the next.
        if serving_ms and self._last_serving_step is not None:
            start, s_ms, r_ms, pred = self._last_serving_step
            self.controller.observe_iteration((t_start - start) * 1e3, s_ms, r_ms, pred)
        self._last_serving_step = (t_start, serving_ms, rollout_ms, predicted) if serving_ms else None
        self._beat = time.perf_counter()
        if not serving_ms and not rollout_ms and self._waiting and not plan.rollout_admit:
            return 0.001  # nothing can run now (caps); do not spin
        return 0.0

    def _first_token_wait_ms(self, t_work: float) -> float | None:
        """How long the oldest serving request without its first token has waited (ms; None: none waits).
        One handed in but not yet taken arrived during this iteration, begun at `t_work` (perf_counter s)."""
        oldest = min((q.t_arrival for q in self._serving_reqs.values() if q.t_first is None), default=None)
        if self._serves_sent != self._serves_applied:
            oldest = t_work if oldest is None else min(oldest, t_work)
        return None if oldest is None else (time.perf_counter() - oldest) * 1e3

    def _admit_ids(self, ids) -> tuple[int, int]:
        """Put the waiting requests `ids` in the rollout engine: (how many went in, their context tokens)."""
        ids = set(ids)
        went = [r for r in self._waiting if r.request_id in ids and self._admit(r)]
        self._waiting = [r for r in self._waiting if r.request_id not in ids]
        return len(went), sum(len(r.context) for r in went)

    def _admit(self, r: _Rollout) -> bool:
        """Put `r` in the rollout engine; False where it finished or failed instead."""
        if r.spec.max_tokens <= len(r.gen.token_ids):
            r.finish("length", time.perf_counter())
            return False
        eid, spec = r.next_segment()
        self.events.append((self.stats["iterations"], "admit", r.request_id, "resume" if r.segment > 1 else "new"))
        try:
            self.rollout.add_request(eid, r.context, spec)
        except Exception as e:
            settle(r.future, e)
            return False
        r.engine_id, r.admitted_at = eid, next(self._admissions)
        self._running[eid] = r
        return True
