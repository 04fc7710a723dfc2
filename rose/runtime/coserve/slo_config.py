"""What a co-served device promises: its serving model's latency objectives (`SloConfig`) and the
memory rollout work may hold there (`RolloutCaps`). `SloController` (slo.py) plans by them."""
from __future__ import annotations

from dataclasses import dataclass

from rose.errors import config_check


@dataclass(frozen=True)
class SloConfig:
    """Latency objectives of one serving model."""

    ttft_ms: float  # time to first token, arrival -> first token (ms)
    tpot_ms: float  # time per output token after the first (ms)
    attainment: float = 0.99  # fraction of requests that must meet both
    # Fraction of the TPOT budget rollout leaves unused, for prediction error. With learn_margin, `margin`
    # until the executor has measured enough iterations, then the time its periods run past their
    # predictions, within [margin_min, margin_max] widened to hold `margin` (`MarginLearner`); without,
    # `margin` always. On by default, with 16 rollout steps: since the serving worker's agent loops run
    # on its executor's thread the two kept the serving SLO in 26 of 28 end-to-end runs beside a training
    # core (0.9895 and 0.9850 the misses; the fixed margin and 8 steps 6 of 6 alternated with six of
    # them) and in every co-serving run at 8-43 % of capacity but one (0.56, in an hour when serving
    # alone fell to 0.64-0.81): RESULTS.md, elastic_e2e and coserve_slo. On one core here they harvest
    # about what the fixed margin does; the simulator's tail-bound setups gain most (SIMULATION.md).
    margin: float = 0.15
    margin_min: float = 0.05
    margin_max: float = 0.4
    learn_margin: bool = True
    margin_window: int = 16  # iterations a serving request's TPOT averages over (about its output tokens)
    # A waiting request older than this fraction of ttft_ms stops rollout steps; extra steps stop before a
    # request's wait would pass it.
    ttft_guard: float = 0.5
    # Iterations in a row a running rollout batch too slow for this iteration's budget may wait before
    # its newest sequences are preempted (a preemption costs an admission and a recomputed context).
    rollout_waits: int = 3
    # Rollout steps one iteration may run between two serving steps, at most (1: strict alternation).
    # A serving step per rollout step costs the rollout a serving step for every token; where the
    # TPOT budget holds several rollout steps (loose SLOs, fast devices), running them back to back
    # keeps the serving request inside its budget and gives rollout the time serving does not need.
    # Each step past the first is checked against the period measured so far (the executor), so a higher
    # cap moves only what the budget allows: in tail-bound setups (small batches, cheap steps) 8 left
    # most of a loose budget to extra serving steps (the simulator: benchmarks/SIMULATION.md).
    max_rollout_steps: int = 16

    def __post_init__(self):
        c = "SloConfig"
        for name in ("ttft_ms", "tpot_ms"):
            v = getattr(self, name)
            config_check(isinstance(v, (int, float)) and 0 < v < 3_600_000, c, name, v, "in (0, 3600000) ms")
        config_check(0 < self.attainment <= 1, c, "attainment", self.attainment, "in (0, 1]")
        config_check(0 <= self.margin < 1, c, "margin", self.margin, "in [0, 1)")
        for name in ("margin_min", "margin_max"):
            config_check(0 <= getattr(self, name) < 1, c, name, getattr(self, name), "in [0, 1)")
        config_check(self.margin_min <= self.margin_max, c, "margin_min", self.margin_min,
                     f"<= margin_max={self.margin_max}")
        config_check(0 < self.ttft_guard <= 1, c, "ttft_guard", self.ttft_guard, "in (0, 1]")
        for name, least in (("rollout_waits", 0), ("max_rollout_steps", 1), ("margin_window", 1)):
            v = getattr(self, name)
            config_check(isinstance(v, int) and v >= least, c, name, v, f"an int >= {least}")


@dataclass(frozen=True)
class RolloutCaps:
    """The memory budget of rollout work on a serving device, as in-flight caps."""

    max_seqs: int = 64  # rollout sequences running at once
    max_kv_tokens: int = 32_768  # KV tokens (prompt + generated) rollout sequences may hold
    # Where engines share device memory (GPUs): the rollout engine sleeps (frees its weights and KV)
    # when the serving engine's KV use reaches `sleep_at`, and wakes below `wake_at` (fractions).
    sleep_at: float = 0.9
    wake_at: float = 0.7

    def __post_init__(self):
        config_check(self.max_seqs >= 0, "RolloutCaps", "max_seqs", self.max_seqs, ">= 0")
        config_check(self.max_kv_tokens >= 0, "RolloutCaps", "max_kv_tokens", self.max_kv_tokens, ">= 0")
        config_check(0 < self.wake_at < self.sleep_at <= 1, "RolloutCaps", "wake_at", self.wake_at,
                     f"in (0, sleep_at={self.sleep_at}) with sleep_at <= 1")
