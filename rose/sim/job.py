"""The RL job's own devices: how an asynchronous policy splits them between the trainer and rollout
engines, and the trainer's progress when an engine shares its devices."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobSplit:
    train_gpus: int  # devices the trainer uses
    dedicated: int  # rollout instances of `tp` devices each
    shared: bool  # the one rollout instance runs on the trainer's devices (there were none to spare)


def job_split(job_gpus: int, train_fraction: float, tp: int, outside_capacity: bool) -> JobSplit:
    """Split `job_gpus` so that no device counts twice: rollout instances take whole multiples of `tp`
    devices from the share `1 - train_fraction`, and the trainer gets the rest. A policy with rollout
    capacity outside the job (serving or on-demand GPUs) may keep none (`train_fraction=1`: every job
    device trains); one without keeps at least one, and where the job has no device to spare for it,
    that instance shares the trainer's devices (a trainer and an engine on one CPU core)."""
    want_train = min(job_gpus, max(1, round(job_gpus * train_fraction)))
    n = (job_gpus - want_train) // tp
    if n == 0 and not outside_capacity:
        n = 1
    if job_gpus - n * tp >= 1:
        return JobSplit(job_gpus - n * tp, n, False)
    return JobSplit(job_gpus, n, True)


class Trainer:
    """One train step's compute at a time. On devices of its own the step takes its exclusive time;
    where a rollout engine shares them, the two time-share (processor sharing, as the OS shares a
    core): each runs at `share` of its speed (half, less what switching costs) while both have work, so
    the step's end moves whenever the engine starts or stops decoding. `end()` is the step's end at the
    current rate."""

    def __init__(self, share: float = 0.5) -> None:
        self.share = share  # each side's speed while both run on shared devices
        self.left = 0.0  # exclusive seconds of compute the step still needs
        self.rate = 1.0  # its speed now (1: the devices are its own)
        self.t = 0.0  # when `left` was last brought up to date
        self.epoch = 0  # invalidates scheduled ends
        self.started = 0.0  # when the step began

    def start(self, now: float, work_s: float, engine_busy: bool) -> float:
        self.left, self.t, self.started = work_s, now, now
        self.rate = self.share if engine_busy else 1.0
        self.epoch += 1
        return self.end()

    def engine_changed(self, now: float, engine_busy: bool) -> float | None:
        """The new end if the rate changed, else None (the scheduled end stands)."""
        rate = self.share if engine_busy else 1.0
        if rate == self.rate:
            return None
        self.left = max(0.0, self.left - (now - self.t) * self.rate)
        self.t, self.rate = now, rate
        self.epoch += 1
        return self.end()

    def end(self) -> float:
        return self.t + self.left / self.rate


def split_for(cfg, policy: str, tp: int, colocated: bool, has_fleet: bool) -> JobSplit:
    """The split a policy runs with: colocated policies train and roll out on every job device."""
    if colocated:
        return JobSplit(cfg.job_gpus, max(1, cfg.job_gpus // tp), False)
    outside = (policy in ("rose", "ideal") and has_fleet and cfg.serving_gpus >= tp) or \
        (policy == "elastic" and cfg.elastic_max_gpus >= tp)
    return job_split(cfg.job_gpus, cfg.train_fraction, tp, outside)
