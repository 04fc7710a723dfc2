"""The share of the TPOT budget rollout leaves unused, learnt from how far the controller's predictions
miss.

A plan predicts each iteration's period (the serving step, the rollout steps beside it and the
iteration's overhead); the executor measures it. A serving request's TPOT is the mean period over its
output tokens, so what the SLO sees is the time the predictions missed, averaged over a run of
iterations, not one iteration's jitter. Plans fill the budget up to `(1 - margin) * tpot_ms`, so the
margin must hold that missed time: it is a high quantile (99.9th) of the windowed mean of (measured -
predicted) / tpot_ms over the last `history` windows. The 99.9th, not the 99th: a stall (another
process, a collection) lands in the `window` windows that hold it, and the requests decoding through
it are the ones that miss; with short windows (short outputs) that is under 1 % of the history,
which the 99th would not cover. Counted in
milliseconds of the budget, not as a ratio: a 2 ms serving-only period that takes 5 ms costs a
request 3 ms, not 150 % of its budget. It starts at a prior (nothing measured yet), stays within
[floor, ceiling], and follows the host: a quiet accelerator whose steps the latency models predict
well gives rollout most of the budget; a busy host keeps more.
"""
from __future__ import annotations

from collections import deque

import numpy as np


class MarginLearner:
    """The margin of one executor's controller (`margin`, a fraction of the TPOT budget), learnt from
    `observe` calls; with floor = ceiling it stays at the prior."""

    def __init__(self, tpot_ms: float, floor: float, prior: float, ceiling: float, window: int = 16,
                 history: int = 1024, min_windows: int = 200, every: int = 32, quantile: float = 99.9):
        self.tpot_ms = tpot_ms  # the budget the missed time is counted against (ms)
        self.floor, self.ceiling = floor, ceiling  # fractions of the TPOT budget
        self.window = window  # iterations a request's TPOT averages over (about its output tokens)
        self.min_windows = min_windows  # windowed means needed before the prior gives way
        self.every = every  # windows (one an iteration, once the first is full) between two re-estimates
        self.quantile = quantile  # percentile of the windowed means the margin covers
        self._missed: deque[float] = deque(maxlen=window)  # (measured - predicted) / tpot_ms, last `window`
        self._sum = 0.0
        self._means: deque[float] = deque(maxlen=history)  # windowed means of the above
        self.windows = 0  # windowed means measured so far
        self.margin = prior

    def observe(self, predicted_ms: float, measured_ms: float) -> None:
        """One iteration's predicted and measured period (ms)."""
        if not (predicted_ms >= 0 and measured_ms >= 0):
            return
        if len(self._missed) == self.window:
            self._sum -= self._missed[0]
        missed = (measured_ms - predicted_ms) / self.tpot_ms
        self._missed.append(missed)
        self._sum += missed
        if len(self._missed) < self.window:
            return
        self._means.append(self._sum / self.window)
        self.windows += 1
        if len(self._means) >= self.min_windows and self.windows % self.every == 0:
            high = float(np.percentile(np.fromiter(self._means, float), self.quantile))
            self.margin = min(self.ceiling, max(self.floor, high))
