"""An engine instance in the simulated cluster, and the rollout tasks it runs.

An instance decodes its running sequences in lockstep: each step gives every running sequence one
token and lasts `period(n)` (its own decode step, plus the serving step before it on a serving GPU).
Progress is a virtual token clock `v`: tokens each running sequence has generated since the
instance started. A task that joins at clock v and must generate d tokens ends its decode when the
clock reaches v + d, however the batch (and so the step time) changes meanwhile; only the next such
end needs an event, and it moves whenever the batch does.
"""
from __future__ import annotations

import heapq

from rose.sim.costs import LinearCost


class Task:
    """One rollout group: a task of `width` trajectories, as the placement sees it."""

    __slots__ = ("key", "step", "width", "tokens", "left", "occ", "env_s", "train_tokens", "varied", "min_version",
                 "inst", "v_end", "placed_at", "extra_s", "done_at", "sheds", "run")

    def __init__(self, key, step, width, tokens, occ, env_s, train_tokens, varied, min_version):
        self.key, self.step, self.width = key, step, width
        self.tokens = self.left = tokens  # decode tokens of its longest trajectory; what is left of them
        self.occ, self.env_s, self.train_tokens, self.varied = occ, env_s, train_tokens, varied
        self.min_version = min_version
        self.inst = None  # the instance running it
        self.v_end = 0.0  # the instance's clock when its decode ends
        self.placed_at = 0.0
        self.extra_s = 0.0  # real time to add before it frees its slots: prefill of a resumed context
        self.done_at = None
        self.sheds = 0
        self.run = 0  # starts so far: an event of an earlier start is stale


class Instance:
    __slots__ = ("addr", "kind", "role", "site", "cost", "slots", "used", "version", "up", "v", "t", "serving_ms",
                 "factor", "decoding", "heap", "n_eff", "epoch", "tasks", "busy_s", "env_s", "idle_s",
                 "asked_at", "asleep", "serving_busy_s", "born", "decodes", "steps")

    def __init__(self, addr: str, kind: str, role: str, site: str, cost: LinearCost, slots: int, now: float):
        self.addr, self.kind, self.role, self.site, self.cost = addr, kind, role, site, cost
        self.slots = slots  # rollout sequences it offers now
        self.used = 0  # sequences of placed, unfinished tasks
        self.version = 0
        self.up = True
        self.v = 0.0  # virtual token clock
        self.t = now  # when `v` was last brought up to date
        self.serving_ms = 0.0  # the serving step that precedes each rollout step (serving instances)
        self.factor = 1.0  # period multiplier (ideal's serving instances: 1 / spare share)
        self.decoding: dict[str, Task] = {}
        self.heap: list[tuple[float, str]] = []  # (v_end, key) of decoding tasks
        self.n_eff = 0.0  # sequences in the decode batch
        self.epoch = 0  # invalidates scheduled decode-end events
        self.tasks: dict[str, Task] = {}  # placed, unfinished
        self.busy_s = self.env_s = self.idle_s = 0.0  # time decoding / only waiting on environments / empty
        self.serving_busy_s = 0.0  # of busy_s, the serving steps' share
        self.asked_at = now
        self.born = now  # when it came up (its time since is busy_s + env_s + idle_s)
        self.decodes = 0  # serving requests decoding (serving instances)
        self.steps = None  # (decodes, rollout sequences) -> rollout steps an iteration runs (the controller's)
        self.asleep = False

    @property
    def free(self) -> int:
        return self.slots - self.used

    def period_s(self) -> float:
        """What one token of every running sequence takes at the current batch (s): a decode step, plus
        on a serving instance its share of the serving step (k rollout steps run beside each one)."""
        r = self.cost.decode_ms(self.n_eff)
        if self.serving_ms and self.steps is not None:
            k = max(1, self.steps(self.decodes, int(self.n_eff + 0.5)))
            return (self.serving_ms / k + r) * self.factor / 1e3
        return (self.serving_ms + r) * self.factor / 1e3

    def holds_core(self, cpu: bool) -> bool:
        """Whether this engine takes its devices' time now: while it decodes, and on a CPU host (`cpu`) also
        between two turns of its rollouts (the agent loop's work there runs on the same core; the
        calibration's per-turn overhead is that work, not an idle wait)."""
        return self.n_eff > 0 or (cpu and bool(self.tasks))

    def core_slowdown(self) -> float:
        """How much slower than on a core of its own the agent loop's work between two turns runs here, on a
        CPU host where that work shares the worker's core with its engines: on a serving instance it gets
        the rollout's share of the core (the serving steps come first); beside the trainer, its share."""
        if self.serving_ms:
            r = self.cost.decode_ms(self.n_eff) * self.factor / 1e3
            return self.period_s() / r
        return self.factor if self.factor < 1e6 else 1.0

    def advance(self, now: float) -> None:
        dt = now - self.t
        if dt <= 0:
            return
        if self.n_eff > 0:
            p = self.period_s()
            self.v += dt / p
            self.busy_s += dt
            self.serving_busy_s += dt * (1 - self.cost.decode_ms(self.n_eff) * self.factor / 1e3 / p)
        elif self.tasks:
            self.env_s += dt
        else:
            self.idle_s += dt
        self.t = now

    def next_end(self) -> float | None:
        """When the first decoding task ends at the current batch (None: nothing decodes)."""
        while self.heap and self.heap[0][1] not in self.decoding:
            heapq.heappop(self.heap)
        if not self.heap:
            return None
        return self.t + max(0.0, self.heap[0][0] - self.v) * self.period_s()

    def start(self, task: Task, now: float) -> None:
        self.advance(now)
        task.inst, task.placed_at = self, now
        task.run += 1
        task.v_end = self.v + task.left
        self.tasks[task.key] = task
        self.decoding[task.key] = task
        heapq.heappush(self.heap, (task.v_end, task.key))
        self.used += task.width
        self.n_eff += task.occ

    def end_decodes(self, now: float) -> list[Task]:
        """Tasks whose decode has ended by `now` (the instance's clock is brought to `now`)."""
        self.advance(now)
        out = []
        while self.heap and self.heap[0][0] <= self.v + 1e-6:
            _, key = heapq.heappop(self.heap)
            t = self.decoding.pop(key, None)
            if t is not None:
                self.n_eff -= t.occ
                out.append(t)
        if not self.decoding:
            self.n_eff = 0.0
        return out

    def finish(self, task: Task) -> None:
        del self.tasks[task.key]
        self.used -= task.width

    def remove(self, task: Task, now: float) -> None:
        """Take a task off (shed or lost), keeping what it decoded in `task.left`."""
        self.advance(now)
        if task.key in self.decoding:
            del self.decoding[task.key]
            self.n_eff = max(0.0, self.n_eff - task.occ) if self.decoding else 0.0
            task.left = max(1.0, task.v_end - self.v)
        self.finish(task)
        task.inst = None
