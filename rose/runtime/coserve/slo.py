"""The co-serving executor's decisions, as a pure function of a snapshot.

One executor steps two engines on one device: the serving engine every iteration, then the rollout
engine as many times as the plan says (none, one, or more where the TPOT budget holds them). A
serving request therefore sees, between two of its tokens, one serving step plus the iteration's
rollout steps: those are what the plan budgets. Each iteration the controller

1. always plans the serving step first (it never waits for rollout work);
2. predicts the serving step's time (an online fit of step time against batched tokens) and the
   time left for rollout under the TPOT budget, less a safety margin (fixed, or learnt from how far
   measured periods overshoot the predictions: `margin.py`) and what an iteration costs besides its steps
   (the executor's own work and the HTTP front end: a few milliseconds no step model sees);
3. skips the rollout step when a waiting serving request is close to its TTFT deadline;
4. admits waiting rollout sequences while the predicted rollout step stays within what is left, and
   while the rollout in-flight caps (sequences, KV tokens: the memory budget) hold; with no serving
   request in the engine, the caps alone bind. Step times are predicted from the sequences a step
   decodes, the requests it admits and their context tokens apart (`LatencyModel`): an admission
   costs a request's setup, which a plain decode step does not pay;
5. when the running rollout batch does not fit beside this iteration's serving step but would beside
   its decodes alone, lets it wait (no rollout step: a sequence that is not stepped costs no time) for
   up to `rollout_waits` iterations in a row, since serving steps swing with the prefills that arrive;
   otherwise, or after that, preempts running sequences, newest first, until the batch fits. Serving's
   need for KV memory preempts at once. Preempted sequences keep their tokens and resume later, but
   resuming recomputes their context;
6. beside a serving step, plans as many more decode steps of the running batch as the budget still
   holds, up to `max_rollout_steps` in all: with strict alternation every rollout token would cost a
   whole serving step, on devices where a serving step is a large part of the period and the TPOT
   budget is several periods long. A request that this serving step prefills whole has its first
   token when the step ends; one whose prompt needs more steps, or one that arrives during the
   period, waits the period out only while that keeps it inside `ttft_guard` of its TTFT budget
   (`first_token_can_wait`). Ending the period at every arrival cost serving a step, and rollout the
   rest of its period, once a request: with arrivals a period apart, most periods.

`SloController.plan` returns an `IterationPlan`, a plain record; the executor only applies it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from rose.runtime.coserve.latency import LatencyModel
from rose.runtime.coserve.margin import MarginLearner
from rose.runtime.coserve.slo_config import RolloutCaps, SloConfig

__all__ = ["IterationPlan", "LatencyModel", "RolloutCaps", "RolloutSeq", "RolloutView", "ServingView", "SloConfig",
           "SloController"]


@dataclass(frozen=True)
class ServingView:
    """What the controller needs of the serving engine now."""

    decoding: int = 0  # running sequences: one token each this step
    waiting_prompt_tokens: tuple[int, ...] = ()  # per waiting request, prompt tokens left to prefill
    oldest_wait_ms: float = 0.0  # age of the oldest request that has no first token yet
    kv_free_tokens: int = 1 << 30  # KV tokens the serving engine can still take
    kv_needed_tokens: int = 0  # KV tokens its waiting requests need to start
    kv_usage: float = 0.0  # fraction of the serving engine's KV cache in use


@dataclass(frozen=True)
class RolloutSeq:
    request_id: str
    kv_tokens: int  # prompt + generated so far
    admitted_at: float = 0.0  # monotonic order of admission (newest preempted first)


@dataclass(frozen=True)
class RolloutView:
    running: tuple[RolloutSeq, ...] = ()
    waiting: tuple[RolloutSeq, ...] = ()  # fresh or preempted sequences, in arrival order
    # KV tokens the device can give to rollout beyond what serving holds and reserves right now
    kv_available_tokens: int = 1 << 30
    can_sleep: bool = False  # the rollout engine shares device memory and can sleep (vLLM sleep mode)
    asleep: bool = False
    waited: int = 0  # iterations in a row the running batch was not stepped


@dataclass(frozen=True)
class IterationPlan:
    serving_tokens: int  # tokens the serving step batches (prefill chunk + decodes)
    serving_ms: float  # predicted serving step time
    rollout_step: bool  # step the rollout engine after the serving engine
    rollout_admit: tuple[str, ...] = ()
    rollout_preempt: tuple[str, ...] = ()
    rollout_tokens: int = 0  # tokens the rollout step batches (one per running sequence, plus admitted contexts)
    rollout_ms: float = 0.0  # predicted rollout step time
    budget_ms: float = 0.0  # what rollout could use: TPOT budget minus margin minus serving_ms
    reason: str = ""  # why rollout was held back, if it was
    rollout_sleep: bool | None = None  # True: put the rollout engine to sleep; False: wake it; None: as is
    notes: dict = field(default_factory=dict)
    # Rollout steps this iteration runs back to back (the first batches `rollout_tokens`, the others one
    # decode token per running sequence); 0 with no rollout step
    rollout_steps: int = 0
    serving_admits: int = 0  # serving requests waiting for their first token (prefilled in this step)
    serving_prefill: int = 0  # their prompt tokens this step prefills


class SloController:
    """Plans each iteration of one co-serving executor. Holds only what it learns: the latency models,
    the iteration overhead and the margin."""

    def __init__(self, slo: SloConfig, caps: RolloutCaps = RolloutCaps(), prefill_chunk: int = 512,
                 serving_model: LatencyModel | None = None, rollout_model: LatencyModel | None = None):
        self.slo = slo
        self.caps = caps
        self.prefill_chunk = prefill_chunk  # prompt tokens the serving engine prefills per step at most
        # Priors until measured: a new request's setup 1 ms; an admitted rollout context costs its prefill
        # (a serving step's prefill is in its tokens already).
        self.serving_model = serving_model or LatencyModel(per_admit_ms=1.0)
        self.rollout_model = rollout_model or LatencyModel(per_admit_ms=1.0, per_context_ms=0.05)
        # What an iteration costs beyond the two engine steps (the executor's own work, the HTTP
        # front end and Dask taking their turn on the interpreter): learned from measured iteration
        # periods, as a mean plus a mean upward deviation, and kept out of the rollout budget.
        self.overhead_ms = 0.0
        self.overhead_dev_ms = 0.0
        bounds = (min(slo.margin_min, slo.margin), max(slo.margin_max, slo.margin)) if slo.learn_margin else \
            (slo.margin, slo.margin)
        self.margin_learner = MarginLearner(slo.tpot_ms, bounds[0], slo.margin, bounds[1], slo.margin_window)

    @property
    def margin(self) -> float:  # the share of the TPOT budget rollout leaves unused now
        return self.margin_learner.margin

    def observe_iteration(self, period_ms: float, serving_ms: float, rollout_ms: float,
                          predicted_ms: float | None = None, decay: float = 0.95) -> None:
        """One iteration's measured period (serving step start to the next), its two steps' times, and
        the period its plan predicted (steps and overhead; None: nothing to check it against)."""
        extra = max(0.0, period_ms - serving_ms - rollout_ms)
        dev = max(0.0, extra - self.overhead_ms)
        self.overhead_ms = decay * self.overhead_ms + (1 - decay) * extra
        self.overhead_dev_ms = decay * self.overhead_dev_ms + (1 - decay) * dev
        if predicted_ms is not None and self.slo.learn_margin:  # a fixed margin has nothing to learn
            self.margin_learner.observe(predicted_ms, period_ms)

    def _budget(self, serving_ms: float) -> float:
        """What rollout may use beside a serving step of `serving_ms`: the TPOT budget less the margin,
        the serving step and the iteration's overhead."""
        return self.slo.tpot_ms * (1 - self.margin) - serving_ms - self.overhead_ms - 2 * self.overhead_dev_ms

    def rollout_capacity(self, serving_tokens: int) -> int:
        """Rollout sequences that could decode next to a serving step of `serving_tokens` inside the
        TPOT budget (what a serving worker offers the placement as slots), up to the caps. With no
        serving load there is no TPOT to keep: the caps alone (as `plan` admits then); a load arriving
        shrinks the offer and the placement sheds what no longer fits."""
        if serving_tokens <= 0:
            return self.caps.max_seqs
        budget = self._budget(self.serving_model.predict(serving_tokens))
        lo, hi = 0, self.caps.max_seqs
        while lo < hi:  # the largest n whose predicted step fits (predictions grow with n)
            mid = (lo + hi + 1) // 2
            if self.rollout_model.predict(mid) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def extra_steps(self, budget_ms: float, first_ms: float, seqs: int) -> int:
        """Decode steps of `seqs` running sequences that fit after a first rollout step of `first_ms`
        in what is left of `budget_ms`, within `max_rollout_steps` in all."""
        if seqs <= 0 or not math.isfinite(budget_ms):
            return 0
        step = self.rollout_model.predict(seqs)
        if step <= 0:
            return 0
        return max(0, min(self.slo.max_rollout_steps - 1, int((budget_ms - first_ms) // step)))

    def first_token_can_wait(self, waited_ms: float, more_ms: float) -> bool:
        """Whether a serving request that has waited `waited_ms` for its first token may wait `more_ms` more
        (rollout steps before its next prefill step) and stay inside the TTFT guard (`SloConfig.ttft_guard`)."""
        return waited_ms + more_ms < self.slo.ttft_guard * self.slo.ttft_ms

    def steps_beside(self, serving_tokens: int, seqs: int) -> int:
        """Rollout steps an iteration runs beside a serving step of `serving_tokens` with `seqs` running
        rollout sequences, once none is being admitted (what `plan` gives a steady batch)."""
        if seqs <= 0:
            return 0
        if serving_tokens <= 0:
            return 1
        budget = self._budget(self.serving_model.predict(serving_tokens))
        first = self.rollout_model.predict(seqs)
        return 1 + self.extra_steps(budget, first, seqs) if first <= budget else 0

    def plan(self, serving: ServingView, rollout: RolloutView) -> IterationPlan:
        waiting_tokens = sum(serving.waiting_prompt_tokens)  # prompt tokens still to prefill
        prefill = min(waiting_tokens, self.prefill_chunk)
        s_tokens = serving.decoding + prefill
        s_admits = len(serving.waiting_prompt_tokens)
        s_ms = self.serving_model.predict(s_tokens, s_admits, prefill)
        budget = self._budget(s_ms)
        running = sorted(rollout.running, key=lambda r: r.admitted_at)

        # Shared device memory nearly full: every rollout sequence goes, and the engine sleeps.
        if rollout.can_sleep and (serving.kv_usage >= self.caps.sleep_at
                                  or (rollout.asleep and serving.kv_usage > self.caps.wake_at)):
            return IterationPlan(s_tokens, s_ms, False, (), tuple(r.request_id for r in running), 0, 0.0, budget,
                                 "serving needs the device's memory: rollout sleeps",
                                 rollout_sleep=None if rollout.asleep else True,
                                 notes={"preempt_causes": {r.request_id: "rollout sleeps" for r in running}})
        wake = False if rollout.asleep else None
        # Memory first: serving requests that cannot start for lack of KV take it from rollout.
        preempt: list[RolloutSeq] = []
        causes: dict[str, str] = {}  # preempted request id -> why (the executor logs it)
        pressure = serving.kv_needed_tokens > serving.kv_free_tokens
        kv_short = max(0, serving.kv_needed_tokens - serving.kv_free_tokens)
        while kv_short > 0 and running:
            victim = running.pop()
            preempt.append(victim)
            causes[victim.request_id] = "serving KV pressure"
            kv_short -= victim.kv_tokens
        held = sum(r.kv_tokens for r in running)
        while running and (len(running) > self.caps.max_seqs or held > self.caps.max_kv_tokens
                           or held > rollout.kv_available_tokens):
            victim = running.pop()
            preempt.append(victim)
            causes[victim.request_id] = "rollout memory caps"
            held -= victim.kv_tokens

        def done(step: bool, reason: str = "", admit=(), tokens: int = 0, context: int = 0) -> IterationPlan:
            tokens = tokens if step else 0
            first = self.rollout_model.predict(len(running), len(admit), context) if tokens else 0.0
            steps = 0
            if step and tokens > 0:
                # More steps only beside a serving step. A request this serving step prefills whole has its
                # first token when the step ends (it is sent while the rollout steps run); one whose prompt
                # needs more steps waits the period out only while that keeps it inside the TTFT guard.
                beside = s_tokens and (waiting_tokens == prefill
                                       or self.first_token_can_wait(serving.oldest_wait_ms, budget))
                steps = 1 + (self.extra_steps(budget, first, len(running)) if beside else 0)
            return IterationPlan(s_tokens, s_ms, step and tokens > 0, tuple(admit),
                                 tuple(r.request_id for r in preempt), tokens,
                                 first, budget, reason,
                                 rollout_sleep=wake if (admit or running) else None,
                                 notes={"preempt_causes": causes} if causes else {}, rollout_steps=steps,
                                 serving_admits=s_admits, serving_prefill=prefill)

        if serving.decoding == 0 and not serving.waiting_prompt_tokens:
            # No serving request to protect: rollout runs within the memory caps alone. This also keeps
            # rollout live when the latency model errs high (one slow first step can make it predict
            # that nothing fits, and a model that sees no rollout step never learns otherwise).
            budget = math.inf
        if serving.waiting_prompt_tokens and serving.oldest_wait_ms >= self.slo.ttft_guard * self.slo.ttft_ms:
            return done(False, "a serving request is near its TTFT deadline")
        if budget <= 0:
            return done(False, "the serving step alone uses the TPOT budget")
        # The running batch must fit. A serving step swollen by arriving prefills passes in an iteration
        # or two: a batch that would fit beside the serving decodes alone waits that out; otherwise, or
        # past `rollout_waits`, the newest go until it fits (they resume later).
        batch_ms = self.rollout_model.predict(len(running))
        decodes_only_budget = budget + s_ms - self.serving_model.predict(serving.decoding)
        if running and budget < batch_ms <= decodes_only_budget and rollout.waited < self.slo.rollout_waits:
            return done(False, "the running rollout batch waits for a lighter serving step")
        while running and self.rollout_model.predict(len(running)) > budget:
            preempt.append(running.pop())
            causes[preempt[-1].request_id] = "TPOT budget"
        if not running and not rollout.waiting:
            return done(False, "no rollout work")
        admit: list[str] = []
        context = 0  # admitted sequences' context tokens
        if not pressure:  # never admit while serving is short of memory (what was freed is serving's)
            new = self._admissions(running, rollout.waiting, rollout.kv_available_tokens, budget)
            running += new
            admit, context = [w.request_id for w in new], sum(w.kv_tokens for w in new)
        return done(True, "" if running else "no rollout sequence fits", admit, len(running) + context, context)

    def _admissions(self, running, waiting, kv_available: int, budget_ms: float) -> list[RolloutSeq]:
        """The waiting sequences, in order, that join `running` in a step predicted within `budget_ms`
        and within the caps. An admitted sequence's first step computes its whole context (a preempted
        one's prefix may be cached; counting it all errs on the side of serving) and costs the engine a
        new request's setup."""
        held = sum(r.kv_tokens for r in running)
        out: list[RolloutSeq] = []
        context = 0
        for w in waiting:
            n = len(running) + len(out) + 1
            if (n > self.caps.max_seqs or held + w.kv_tokens > self.caps.max_kv_tokens
                    or held + w.kv_tokens > kv_available
                    or self.rollout_model.predict(n, len(out) + 1, context + w.kv_tokens) > budget_ms):
                break
            out.append(w)
            held += w.kv_tokens
            context += w.kv_tokens
        return out

    def admit_between(self, rollout: RolloutView, time_left_ms: float) -> tuple[str, ...]:
        """Before one more rollout step of an iteration (one its plan allowed beside the serving step):
        the waiting sequences that join the running batch with the step still predicted inside the
        `time_left_ms` the period has left. Each turn of a multi-turn rollout is a new request, so a
        device whose plans admit only in their first step is bound by admissions while its extra steps
        decode an ever smaller batch."""
        if not rollout.waiting or rollout.asleep:
            return ()
        return tuple(w.request_id for w in self._admissions(rollout.running, rollout.waiting,
                                                             rollout.kv_available_tokens, time_left_ms))
