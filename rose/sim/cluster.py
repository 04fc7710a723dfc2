"""The simulated RL job: a discrete-event loop over rollout, training, weight sync and serving load.

Policies (`SimConfig.policies`):
- fixed_sync: verl-style, colocated. Every job GPU rolls out, then every job GPU trains, then the
  engines reload the new weights in place. No staleness.
- fixed_async: AReaL-style, disaggregated. `train_fraction` of the job GPUs train, the rest roll out
  continuously, up to `staleness` versions behind; sync over the cluster network.
- elastic: fixed_async plus on-demand rollout instances (the runtime's `elastic_target` decides how
  many), each after an allocation delay and a cold start, up to an availability cap, maybe preempted.
- rose: fixed_async plus the serving GPUs' spare capacity, offered by the real SLO controller and
  placed by the real `place` policy (dedicated first), shed when serving needs it back.
- ideal: rose's upper bound: serving GPUs lend their spare time and memory with no SLO budget, no
  margin, no sleep, and weights reach them for free; its rollouts step at a dedicated engine's cost.

Decisions come from the runtime's pure functions: `place`, `plan_shed` and `plan_migrate` (placement),
`elastic_target` (the elastic scaler), `SloController.rollout_capacity` and `steps_beside` (a serving GPU's
spare capacity and how many rollout steps run beside each serving step), `more_groups` (DAPO rounds) and
`plan_sync` (weight transfer). The loop only applies them.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections import deque

import numpy as np

from rose.config import ElasticConfig
from rose.sim.config import SimConfig
from rose.sim.instance import Instance, Task
from rose.sim.job import Trainer, split_for
from rose.sim.platform import AZURE_CSV, Platform, build
from rose.sim.result import SimResult
from rose.sim.scaling import PAUSED, instance_up, place_waiting, preempt, scale_elastic, serving_tick
from rose.sim.sync import sync_step
from rose.sim.workload import ServingLoad, next_round, sample_groups, varied_fraction


STALL_S = 6 * 3600.0  # simulated time without a finished rollout that means the setup cannot progress


class SimulationError(RuntimeError):
    """A setup that cannot make progress (no capacity ever fits its groups)."""


class Simulation:
    """One setup under one policy: `Simulation(cfg, policy).run()` -> `SimResult`."""

    def __init__(self, cfg: SimConfig, policy: str, azure_csv: str = AZURE_CSV, platform: Platform | None = None):
        self.cfg, self.policy = cfg, policy
        # Separate streams: every policy sees the same groups, serving load and DAPO shares, whatever else it draws.
        self.rng = np.random.default_rng([cfg.seed, 1])  # elastic delays and lifetimes
        self.load_rng = np.random.default_rng([cfg.seed, 2])
        self.plat = platform or build(cfg, np.random.default_rng([cfg.seed, 0]), azure_csv)
        self.azure_csv = azure_csv
        self.events: list = []
        self.seq = itertools.count()
        self.now = 0.0
        self.r = SimResult(cfg.name, policy)
        self.insts: dict[str, Instance] = {}
        self.waiting: dict[int, deque[Task]] = {}
        self.steps: dict[int, dict] = {}
        self.version, self.next_submit, self.next_train, self.training = 0, 0, 0, False
        self.place_due = False
        self.colocated = policy == "fixed_sync" or cfg.colocated
        self.staleness = 0 if policy == "fixed_sync" else cfg.staleness
        tp = self.plat.tp
        self.split = split = split_for(cfg, policy, tp, self.colocated, self.plat.fleet is not None)
        self.train_gpus, self.trainer = split.train_gpus, Trainer(self.plat.share)
        for i in range(split.dedicated):
            roll = self.plat.roll
            self._add(Instance(f"job/{i}", "dedicated", "dedicated", "job", roll, roll.max_seqs, 0.0))
        # the rollout instance that time-shares the trainer's devices (None: the trainer's are its own)
        self.shared = self.insts["job/0"] if split.shared else None
        self.serving: list[Instance] = []
        if policy in ("rose", "ideal") and self.plat.fleet is not None:
            cost = self.plat.fleet.rollout if policy == "rose" else self.plat.roll  # rose's: co-served steps
            for i in range(cfg.serving_gpus // tp):
                inst = Instance(f"serve/{i}", "serving", "serving", "serve", cost, 0, 0.0)
                if policy == "rose":
                    inst.steps = self.plat.fleet.steps  # the controller's rollout steps beside a serving step
                self.serving.append(self._add(inst))
        self.elastic_cfg = None
        if policy == "elastic":
            cap = cfg.elastic_max_gpus // tp
            self.elastic_cfg = ElasticConfig(max_extra=cap, worker_slots=self.plat.roll.max_seqs,
                                             idle_release_s=cfg.idle_release_s,
                                             allocation_delay_s=cfg.allocation_delay_s)
            self.arriving, self.last_busy, self.elastic_ids = 0, 0.0, itertools.count()
        self.retired: list[tuple[Instance, float]] = []  # instances given back or lost, and when
        self.waking: set[str] = set()
        self._waited_for_capacity, self._last_round = False, 0.0

    # --- events -------------------------------------------------------------------------------
    def _at(self, t: float, kind: str, *payload) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def _add(self, inst: Instance) -> Instance:
        self.insts[inst.addr] = inst
        return inst

    def _retime(self, inst: Instance) -> None:
        inst.epoch += 1
        t = inst.next_end()
        if t is not None:
            self._at(t, "decoded", inst.addr, inst.epoch)
        self._trainer_rate(inst)

    def _trainer_rate(self, inst: Instance) -> None:  # the trainer's speed follows the engine sharing its devices
        if inst is self.shared and self.training:
            end = self.trainer.engine_changed(self.now, inst.holds_core(self.plat.cpu is not None))
            if end is not None:
                self._at(end, "trained", self.next_train, self.trainer.epoch)

    def _want_placement(self) -> None:
        if not self.place_due:
            self.place_due = True
            self._at(self.now + self.cfg.tick_s * (1 if self.now > 0 else 0), "place")

    def run(self) -> SimResult:
        wall = time.perf_counter()
        if self.serving:
            self.load = ServingLoad(self.cfg, self.azure_csv, len(self.serving), self.load_rng)
            self._at(0.0, "load", 0)
        self._submit_ready()
        last_progress, done = 0.0, 0
        while self.events:
            self.now, _, kind, payload = heapq.heappop(self.events)
            getattr(self, "_on_" + kind)(*payload)
            if self.next_train >= self.cfg.steps:
                break
            if self.r.tasks_done != done or self.training:
                last_progress, done = self.now, self.r.tasks_done
            elif self.now - last_progress > STALL_S:
                raise SimulationError(self._stuck(f"no rollout finished for {STALL_S / 3600:.0f} h of simulated time"))
        if self.next_train < self.cfg.steps:
            raise SimulationError(self._stuck("nothing left to happen"))
        for inst in self.insts.values():
            inst.advance(self.now)
        self.r.finish(self, time.perf_counter() - wall)
        return self.r

    def _stuck(self, what: str) -> str:
        return (f"{self.cfg.name} / {self.policy}: {what} (at t={self.now:.0f} s, step {self.next_train} of "
                f"{self.cfg.steps}, {sum(len(q) for q in self.waiting.values())} groups of {self.cfg.group_size} "
                f"waiting, {sum(len(i.tasks) for i in self.insts.values())} running, "
                f"{sum(max(0, i.free) for i in self.insts.values() if i.up)} free slots, at most "
                f"{max((i.slots for i in self.insts.values()), default=0)} on one instance)")

    # --- the step driver ----------------------------------------------------------------------
    def _submit_ready(self) -> None:
        while self.next_submit < self.cfg.steps and self.next_submit <= self.version + self.staleness:
            k = self.next_submit
            self.next_submit += 1
            share = varied_fraction(self.cfg, k, np.random.default_rng([self.cfg.seed, 3, k]))
            st = self.steps[k] = dict(sampled=0, kept=0, rounds=0, outstanding=0, tokens=0.0, start=None, end=None,
                                      varied_p=share, trained_groups=0)
            self._round(k, st)

    def _round(self, k: int, st: dict) -> None:
        n = next_round(self.cfg, st["sampled"], st["kept"], st["rounds"])
        if n == 0:
            st["end"] = self.now
            self._try_train()
            return
        g = sample_groups(self.cfg, n, np.random.default_rng([self.cfg.seed, 4, k, st["rounds"]]), st["varied_p"])
        q = self.waiting.setdefault(k, deque())
        min_v = max(0, k - self.staleness)
        for i in range(n):
            key = f"s{k}r{st['rounds']}g{i}"
            q.append(Task(key, k, self.cfg.group_size, float(g.decode_tokens[i]), float(g.occupancy[i]),
                          float(g.env_s[i]), float(g.train_tokens[i]), bool(g.varied[i]), min_v))
        st["rounds"], st["sampled"], st["outstanding"] = st["rounds"] + 1, st["sampled"] + n, st["outstanding"] + n
        self.r.tasks_created += n
        self._want_placement()

    def _task_done(self, task: Task) -> None:
        if task.done_at is not None:
            self.r.duplicates += 1  # a bug: every group must finish exactly once
        task.done_at = self.now
        self.r.tasks_done += 1
        st = self.steps[task.step]
        st["outstanding"] -= 1
        keep = task.varied and st["trained_groups"] < self.cfg.prompts
        if keep:
            st["kept"] += 1
            st["trained_groups"] += 1
            st["tokens"] += task.train_tokens
        if st["outstanding"] == 0:
            self._round(task.step, st)

    def _try_train(self) -> None:
        k = self.next_train
        st = self.steps.get(k)
        if self.training or st is None or st["end"] is None:
            return
        self.training = True
        trajectories = st["trained_groups"] * self.cfg.group_size
        dt = self.plat.train_s(st["tokens"], trajectories, self.train_gpus)
        others = [i for i in self.insts.values() if i.site != "job"]
        if self.plat.contention and others and (any(self.waiting.values()) or any(i.tasks for i in others)):
            dt *= 1 + self.plat.contention  # rollouts on the other device slow the trainer down (CPU hosts)
        if self.colocated:
            for inst in self.insts.values():
                if inst.kind == "dedicated":
                    inst.advance(self.now)
                    inst.factor = PAUSED
                    self._retime(inst)
            dt += self.plat.reload_s()
        busy = self.shared is not None and self.shared.holds_core(self.plat.cpu is not None)
        self._at(self.trainer.start(self.now, dt, busy), "trained", k, self.trainer.epoch)
        if self.shared is not None:  # the engine on the trainer's devices runs at the shared speed meanwhile
            self.shared.advance(self.now)
            self.shared.factor = 1 / self.trainer.share
            self._retime(self.shared)

    def _on_trained(self, k: int, epoch: int) -> None:
        if epoch != self.trainer.epoch:
            return
        self.training = False
        self.r.train_s.append(self.now - self.trainer.started)
        if self.shared is not None:
            self.shared.advance(self.now)
            self.shared.factor = 1.0
            self._retime(self.shared)
        self.next_train = self.version = k + 1
        self.r.step_end.append(self.now)
        st = self.steps[k]
        self.r.trained_trajectories += st["trained_groups"] * self.cfg.group_size
        self.r.demand.append(st["sampled"])
        self.r.rollout_s.append(st["end"] - st["start"] if st["start"] is not None else 0.0)
        if self.colocated:  # the job's engines took the new weights on their own devices (in train_s)
            for inst in self.insts.values():
                if inst.kind == "dedicated":
                    inst.advance(self.now)
                    inst.factor = 1.0
                    inst.version = self.version
                    self._retime(inst)
        sync_step(self, self.version)
        self._submit_ready()
        self._try_train()
        self._want_placement()

    def _on_synced(self, site: str, version: int) -> None:
        for inst in self.insts.values():
            if inst.site == site and inst.version < version:
                inst.version = version
        self._want_placement()

    # --- rollout ------------------------------------------------------------------------------
    def _on_decoded(self, addr: str, epoch: int) -> None:
        inst = self.insts.get(addr)
        if inst is None or epoch != inst.epoch:
            return
        slow = inst.core_slowdown() if self.plat.cpu is not None else 1.0
        for task in inst.end_decodes(self.now):
            self._at(self.now + task.env_s * slow + task.extra_s, "finished", task, task.run)
        self._retime(inst)

    def _on_finished(self, task: Task, run: int) -> None:
        inst = task.inst
        if inst is None or run != task.run:
            return  # it was shed or lost meanwhile and runs again; that run's own event finishes it
        inst.advance(self.now)
        inst.finish(task)
        task.inst = None
        self._trainer_rate(inst)  # with its last rollout gone, the trainer may have the devices to itself again
        self._task_done(task)
        self._want_placement()

    def _on_place(self) -> None:
        self.place_due = False
        # Allocation overhead: time during which work waited while capacity was on its way (on-demand
        # instances being allocated and started, rollout engines waking), state held since the last round.
        if self._waited_for_capacity:
            self.r.alloc_wait_s += self.now - self._last_round
        place_waiting(self)
        if self.elastic_cfg is not None:
            scale_elastic(self)
        coming = (self.elastic_cfg is not None and self.arriving > 0) or bool(self.waking)
        self._waited_for_capacity = coming and any(self.waiting.values())
        self._last_round = self.now

    def _on_load(self, tick: int) -> None:
        serving_tick(self, tick)
        self._at(self.now + self.cfg.load_tick_s, "load", tick + 1)

    def _on_up(self, inst: Instance) -> None:
        instance_up(self, inst)

    def _on_preempted(self, addr: str) -> None:
        preempt(self, addr)

    def _on_woken(self, addr: str) -> None:
        self.waking.discard(addr)
        self.insts[addr].asleep = False
        self._want_placement()
