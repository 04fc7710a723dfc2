"""Serving GPUs in the simulation: their load, what the real SLO controller lets rollout have, and
whether serving kept its SLO.

Each load tick a serving instance's request rate gives its decode batch by Little's law (a request
decodes for its generated tokens, one a step) and the prefill tokens a step sees; the step time then
follows from the cost model, which the batch in turn depends on, so the two are iterated to a fixed
point. The slot offer is `SloController.rollout_capacity` (the runtime's own controller, unchanged),
its latency models first fitted on noisy observations of the true step times, as the executor fits
them online, then capped by the KV memory left beside serving. SLO check per tick, at the 99th
percentile of the tick's load, with the rollout batch at the full offer: TPOT = serving step + the
rollout steps the controller runs beside it (a prefill-swollen serving step runs alone: the
controller lets the rollout batch wait it out), TTFT = the iteration under way when the request
arrives, run out, then the prompt's prefill chunks, the first token with the last one; between two
chunks, the period's rollout steps while the wait stays inside `ttft_guard` of the TTFT budget, then
one step until the request has waited that long (the controller skips rollout after that).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rose.runtime.coserve.slo import RolloutCaps, SloConfig, SloController
from rose.sim.costs import LinearCost
from rose.sim.workload import azure_requests


@dataclass(frozen=True)
class RequestShape:
    prompt_mean: float  # tokens
    prompt_p99: float
    gen_mean: float


def request_shape(azure_csv: str) -> RequestShape:
    reqs = azure_requests(azure_csv)
    return RequestShape(float(reqs[:, 1].mean()), float(np.percentile(reqs[:, 1], 99)), float(reqs[:, 2].mean()))


def p99(decodes):
    """The 99th percentile of a Poisson-distributed decode batch of mean `decodes` (normal approximation)."""
    return decodes + 2.33 * np.sqrt(decodes)


def fitted_controller(slo: SloConfig, serving: LinearCost, rollout: LinearCost, max_seqs: int,
                      rng: np.random.Generator, overhead_ms: float = 0.0, noise: float = 0.1,
                      observations: int = 400) -> SloController:
    """The runtime's controller, its latency models, iteration overhead and TPOT margin learnt from step
    times the cost models give with lognormal noise (sigma `noise`), at the batch sizes a co-served
    device sees."""
    ctl = SloController(slo, RolloutCaps(max_seqs=max_seqs, max_kv_tokens=1 << 40))
    for _ in range(observations):
        s_tok = int(rng.integers(1, 600))
        r_tok = int(rng.integers(1, max(2, max_seqs)))
        predicted = ctl.serving_model.predict(s_tok) + ctl.rollout_model.predict(r_tok) + ctl.overhead_ms
        s_ms = serving.decode_ms(s_tok) * float(rng.lognormal(0, noise))
        r_ms = rollout.decode_ms(r_tok) * float(rng.lognormal(0, noise))
        ctl.serving_model.observe(s_tok, s_ms)
        ctl.rollout_model.observe(r_tok, r_ms)
        period = s_ms + r_ms + overhead_ms * float(rng.lognormal(0, noise))
        ctl.observe_iteration(period, s_ms, r_ms, predicted)
    return ctl


class ServingFleet:
    """The serving side of every serving instance of one kind (same GPU, same two models)."""

    def __init__(self, slo: SloConfig, serving: LinearCost, rollout: LinearCost, shape: RequestShape,
                 rollout_kv_bytes: float, serving_kv_capacity: float, rollout_seq_bytes: float,
                 serving_token_bytes: float, prefill_chunk: int, rng: np.random.Generator, overhead_ms: float = 0.0):
        self.slo, self.serving, self.rollout, self.shape = slo, serving, rollout, shape
        self.rollout_kv_bytes = rollout_kv_bytes  # bytes left for rollout KV with no serving KV
        self.serving_kv_capacity = serving_kv_capacity  # bytes serving may use for KV
        self.rollout_seq_bytes = rollout_seq_bytes  # KV bytes of one rollout sequence
        self.serving_token_bytes = serving_token_bytes
        self.chunk = prefill_chunk
        self.overhead_ms = overhead_ms  # a co-serving iteration beyond its two steps
        self.controller = fitted_controller(slo, serving, rollout, rollout.max_seqs, rng, overhead_ms)
        self._offer: dict[int, int] = {}
        self._steps: dict[tuple[int, int], int] = {}
        self._kept: dict[tuple[int, int], tuple[bool, bool]] = {}

    def steps(self, decodes: int, seqs: int) -> int:
        """Rollout steps the controller runs per iteration beside `decodes` serving decodes (memoised)."""
        key = (decodes, seqs)
        v = self._steps.get(key)
        if v is None:
            v = self._steps[key] = self.controller.steps_beside(decodes, seqs)
        return v

    def offer(self, decodes: int) -> int:
        """Rollout sequences the controller offers beside `decodes` serving decodes (memoised: the
        controller's models are fixed once fitted)."""
        v = self._offer.get(decodes)
        if v is None:
            v = self._offer[decodes] = self.controller.rollout_capacity(decodes)
        return v

    def load(self, rate: np.ndarray, rollout_n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(decode batch, prefill tokens a step, serving step ms) of each instance at `rate` req/s."""
        sh, s = self.shape, self.serving
        period = np.full(rate.shape, s.a_ms / 1e3)
        for _ in range(4):
            b = rate * sh.gen_mean * period
            pre = rate * sh.prompt_mean * period
            s_ms = np.where(rate > 0, s.a_ms + s.b_ms * b + s.prefill_ms_per_token * pre + self.overhead_ms, 0.0)
            r_ms = np.where(rollout_n > 0, self.rollout.a_ms + self.rollout.b_ms * rollout_n, 0.0)
            period = np.maximum((s_ms + r_ms) / 1e3, 1e-4)
        return b, pre, s_ms

    def memory_slots(self, decodes99: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rollout sequences that fit beside serving's KV, serving's KV use as a fraction)."""
        serving_kv = decodes99 * (self.shape.prompt_mean + self.shape.gen_mean) * self.serving_token_bytes
        slots = np.floor(np.maximum(0.0, self.rollout_kv_bytes - serving_kv) / self.rollout_seq_bytes)
        return np.minimum(slots, self.rollout.max_seqs).astype(int), serving_kv / self.serving_kv_capacity

    def kept(self, decodes: int, rollout_n: int) -> tuple[bool, bool]:
        """(serving keeps its SLO beside `rollout_n` rollout sequences, and with none) over a tick (memoised)."""
        key = (decodes, rollout_n)
        v = self._kept.get(key)
        if v is None:
            v = self._kept[key] = (self.slo_ok(decodes, rollout_n)[0], self.slo_ok(decodes, 0)[0])
        return v

    def slo_ok(self, decodes: float, rollout_n: float) -> tuple[bool, float, float]:
        """(kept, TPOT p99 ms, TTFT p99 ms) of one instance over a tick."""
        s, r = self.serving, self.rollout
        b99 = float(p99(decodes))
        k = max(1, self.steps(int(round(decodes)), int(rollout_n))) if decodes > 0 else 1
        r_ms = r.decode_ms(rollout_n)
        s_ms = s.decode_ms(b99) + self.overhead_ms
        tpot = max(s_ms + k * r_ms if decodes > 0 else 0.0, s_ms + s.prefill_ms_per_token * self.chunk)
        left, guard = self.shape.prompt_p99, self.slo.ttft_guard * self.slo.ttft_ms
        t = s_ms + k * r_ms  # the iteration under way when the request arrives runs its steps out
        while True:
            chunk = min(left, self.chunk)
            left -= chunk
            t += s_ms + s.prefill_ms_per_token * chunk  # the first token comes with the last chunk's step
            if left <= 0:
                return tpot <= self.slo.tpot_ms and t <= self.slo.ttft_ms, tpot, t
            # before the next chunk: the period's rollout steps while the wait stays inside the guard, then
            # one step until the guard, then none
            t += k * r_ms if t + k * r_ms < guard else (r_ms if t < guard else 0.0)
