"""The share of the TPOT budget rollout leaves unused, learnt from how far the controller's predictions
miss.

A plan predicts each iteration's period (the serving step, the rollout steps beside it and the
iteration's overhead); the executor measures it. A serving request's TPOT is the mean period over its
output tokens, so what the SLO sees is the overshoot averaged over a run of iterations, not one
iteration's jitter. The margin is the one that would have held the 99th percentile of those windowed
overshoots inside the budget: planning to `(1 - margin)` of the budget leaves room for a mean period
`1 / (1 - margin)` times the prediction. It starts at a prior (nothing measured yet), stays within
[floor, ceiling], and follows the host: a quiet accelerator whose steps the latency models predict
well gives rollout most of the budget; a busy host, where periods swing, keeps more.
"""
from __future__ import annotations

from collections import deque

import numpy as np


class MarginLearner:
    def __init__(self, floor: float, prior: float, ceiling: float, window: int = 16, history: int = 1024,
                 min_windows: int = 200, every: int = 32):
        self.floor, self.ceiling = floor, ceiling  # fractions of the TPOT budget
        self.window = window  # iterations a request's TPOT averages over (about its output tokens)
        self.min_windows = min_windows  # windowed means needed before the prior gives way
        self.every = every  # iterations between two re-estimates
        self._ratios: deque[float] = deque(maxlen=window)  # measured / predicted period, last `window`
        self._sum = 0.0
        self._means: deque[float] = deque(maxlen=history)  # windowed mean ratios
        self.windows = 0  # windowed means measured so far
        self.margin = prior

    def observe(self, predicted_ms: float, measured_ms: float) -> None:
        """One iteration's predicted and measured period (ms)."""
        if not (predicted_ms > 0 and measured_ms >= 0):
            return
        if len(self._ratios) == self.window:
            self._sum -= self._ratios[0]
        ratio = measured_ms / predicted_ms
        self._ratios.append(ratio)
        self._sum += ratio
        if len(self._ratios) < self.window:
            return
        self._means.append(self._sum / self.window)
        self.windows += 1
        if len(self._means) >= self.min_windows and self.windows % self.every == 0:
            p99 = float(np.percentile(np.fromiter(self._means, float), 99))
            self.margin = min(self.ceiling, max(self.floor, 1.0 - 1.0 / max(p99, 1e-9)))
