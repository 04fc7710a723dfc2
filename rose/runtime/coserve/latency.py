"""Step time against batched tokens, learnt online: what the SLO controller predicts steps with."""
from __future__ import annotations


class LatencyModel:
    """Step time (ms) against tokens batched in the step: a + b * tokens, fitted online.

    Exponentially weighted least squares over the executor's own measurements, plus a running
    mean of the positive residuals, added to every prediction so it errs high.
    """

    def __init__(self, base_ms: float = 5.0, per_token_ms: float = 0.5, decay: float = 0.98):
        self.decay = decay
        # Weighted sums for the fit; seeded with a prior worth a few observations at two sizes.
        self._sw = self._sx = self._sy = self._sxx = self._sxy = 0.0
        for tokens in (1.0, 64.0):
            self._add(tokens, base_ms + per_token_ms * tokens, weight=2.0)
        self.slack_ms = 0.0  # mean positive residual

    def _add(self, x: float, y: float, weight: float = 1.0) -> None:
        d = self.decay
        self._sw = d * self._sw + weight
        self._sx = d * self._sx + weight * x
        self._sy = d * self._sy + weight * y
        self._sxx = d * self._sxx + weight * x * x
        self._sxy = d * self._sxy + weight * x * y

    @property
    def coefficients(self) -> tuple[float, float]:
        n, sx, sy = self._sw, self._sx, self._sy
        var = n * self._sxx - sx * sx
        b = (n * self._sxy - sx * sy) / var if var > 1e-9 else 0.0
        b = max(b, 0.0)  # more tokens never make a step faster
        return max((sy - b * sx) / n, 0.0), b

    def observe(self, tokens: int, ms: float) -> None:
        if tokens < 0 or not ms >= 0:
            return
        err = ms - self.predict_mean(tokens)
        self.slack_ms = self.decay * self.slack_ms + (1 - self.decay) * max(err, 0.0)
        self._add(float(tokens), float(ms))

    def predict_mean(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        a, b = self.coefficients
        return a + b * tokens

    def predict(self, tokens: int) -> float:
        """A conservative estimate (ms) of a step batching `tokens`; 0 for an empty step."""
        return self.predict_mean(tokens) + self.slack_ms if tokens > 0 else 0.0
