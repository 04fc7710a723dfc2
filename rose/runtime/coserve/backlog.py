"""How many rollout trajectories a co-served device keeps moving: beyond them, a trajectory placed there
only waits for admission.

A serving worker's offer (`SloController.rollout_capacity`) counts the sequences one decode step can
batch beside the serving load inside the TPOT budget. Where rollout turns are short, a device is
bound by admissions instead: every turn is a new engine request whose context is computed first, and
the budget holds only a few of those an iteration. Trajectories placed beyond what it admits then
queue inside the executor, where no other worker can take them, while a worker freed later (a
colocated rollout worker once its trainer's step ends) finds nothing left to do. A trajectory left
in the scheduler's queue goes to whichever worker has room first. (End to end on two cores, 2026-12-03,
rose-only `elastic_e2e.py --quick --steps 8`, alternated: 46.5-73.7 traj/s with the bound, 35.0-59.4
without; the serving worker held 20-26 sequences on average with it, 59-89 without. RESULTS.md.)

So the offer is also bounded by what the device keeps busy, learnt while it is saturated (requests
waiting after an iteration's admissions beyond a short queue of `queue_iterations` iterations'
worth of admissions): then it holds `in_flight - (waiting - queue)` trajectories usefully, where
`in_flight` is what the placement counts on the worker (trajectories of its running tasks: in the
engine, waiting for admission, between turns in the environment, or done and waiting for their
group). A device that keeps up with everything it holds, up to the bound, earns a larger
bound (`growth` an iteration): the serving load fell, or the bound was learnt in a worse moment.
"""
from __future__ import annotations

from rose.errors import config_check


class OfferBound:
    """The learnt bound (`value`, trajectories; None until the device was seen saturated), fed one
    `observe` per executor iteration with rollout work."""

    def __init__(self, queue_iterations: float = 3.0, decay: float = 0.99, growth: float = 0.01, floor: int = 8):
        config_check(queue_iterations > 0, "OfferBound", "queue_iterations", queue_iterations, "> 0")
        config_check(0 < decay < 1, "OfferBound", "decay", decay, "in (0, 1)")
        config_check(growth >= 0, "OfferBound", "growth", growth, ">= 0")
        config_check(floor >= 1, "OfferBound", "floor", floor, ">= 1")
        self.queue_iterations = queue_iterations  # admissions' worth of requests a saturated device keeps queued
        self.decay = decay  # per saturated iteration, of the running means (about 100 iterations' memory)
        self.growth = growth  # relative rise of the bound per iteration that kept up with all it held
        self.floor = floor  # trajectories: the bound never falls below it (a GRPO group must still fit)
        self.admits: float | None = None  # mean requests admitted an iteration while requests waited
        self.value: float | None = None

    def observe(self, in_flight: int, waiting: int, admitted: int) -> None:
        """One iteration: `in_flight` trajectories on the worker, `waiting` requests left waiting for
        admission after it admitted `admitted`."""
        if waiting > 0:
            self.admits = float(admitted) if self.admits is None else \
                self.decay * self.admits + (1 - self.decay) * admitted
            queue = self.queue_iterations * max(self.admits, 1.0)
            if waiting > queue:  # saturated: what it holds beyond the queue only waits
                n = max(float(self.floor), in_flight - (waiting - queue))
                self.value = n if self.value is None else self.decay * self.value + (1 - self.decay) * n
                return
        # Kept up with as much as the bound lets the placement give it (whole groups: to within `floor`).
        if self.value is not None and in_flight + self.floor > self.value:
            self.value *= 1 + self.growth

    def bound(self, offer: int) -> int:
        """`offer` (sequences) within the learnt bound."""
        return offer if self.value is None else min(offer, max(self.floor, int(self.value)))
