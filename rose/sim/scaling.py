"""What changes the simulated cluster's rollout capacity: placement rounds, serving load ticks (with
shedding and sleep/wake), and the elastic baseline's on-demand instances (arrival, release,
preemption). Each applies a decision of the runtime's own pure policy to the simulation's state."""
from __future__ import annotations

import itertools
from collections import deque
from time import perf_counter

import numpy as np

from rose.runtime.placement.elastic import elastic_target
from rose.runtime.placement.policy import (ROLES_OF_POLICY, InFlight, RolloutTask, Running, WorkerSlot, place,
                                          plan_migrate, plan_shed)
from rose.sim.instance import Instance, Task
from rose.sim.serving import p99

PLACE_POLICY = {"fixed_sync": "fixed", "fixed_async": "fixed", "elastic": "elastic", "rose": "rose", "ideal": "rose"}
PAUSED = 1e9  # period factor of an engine that yields its devices to the trainer


def place_waiting(sim) -> None:
    ready = [i for i in sim.insts.values() if i.up and not i.asleep and i.free > 0 and i.factor < PAUSED]
    if not ready:
        return
    if not any(sim.waiting.values()):
        if sim.serving and sim.cfg.migrate_tail:
            migrate(sim, ready)
        return
    limit = sum(i.free for i in ready) // sim.cfg.group_size + 1  # more than this cannot be placed
    tasks, by_key = [], {}
    for k in sorted(sim.waiting):
        for t in itertools.islice(sim.waiting[k], limit):
            tasks.append(RolloutTask(t.key, t.width, t.min_version, f"s{k}"))
            by_key[t.key] = t
    workers = [WorkerSlot(i.addr, i.role, i.slots, i.used, i.version) for i in ready]
    t0 = perf_counter()
    out = place(tasks, workers, PLACE_POLICY[sim.policy])
    sim.r.placement_cpu_s += perf_counter() - t0
    sim.r.placement_calls += 1
    if not out:
        return
    placed = set()
    for a in out:
        task, inst = by_key[a.key], sim.insts[a.worker]
        _resume_cost(sim, task, inst)
        inst.start(task, sim.now)
        sim._retime(inst)
        st = sim.steps[task.step]
        if st["start"] is None:
            st["start"] = sim.now
        placed.add(a.key)
        sim.r.placements[a.reason] = sim.r.placements.get(a.reason, 0) + 1
    for k, q in sim.waiting.items():
        head = [q.popleft() for _ in range(min(limit, len(q)))]
        q.extendleft(reversed([t for t in head if t.key not in placed]))


def _resume_cost(sim, task: Task, inst: Instance) -> None:
    """A continuation recomputes its context first (it moved: shed to room elsewhere, migrated or preempted)."""
    if task.tokens != task.left:
        context = sim.cfg.prompt_tokens + task.tokens - task.left
        task.extra_s += context * task.occ * inst.cost.prefill_ms_per_token / 1e3


def migrate(sim, ready: list[Instance]) -> None:
    running = [Running(t.key, i.addr, t.width, t.placed_at) for i in sim.serving for t in i.decoding.values()]
    if not running:
        return
    workers = [WorkerSlot(i.addr, i.role, i.slots, i.used, i.version) for i in ready if i.role == "dedicated"]
    workers += [WorkerSlot(i.addr, "serving", i.slots, i.used, i.version) for i in sim.serving]
    tasks = {t.key: t for i in sim.serving for t in i.decoding.values()}
    for a in plan_migrate(running, workers, waiting=0):
        task = tasks[a.key]
        src, dst = task.inst, sim.insts[a.worker]
        if dst.version < task.min_version:
            continue
        src.remove(task, sim.now)
        sim._retime(src)
        _resume_cost(sim, task, dst)
        dst.start(task, sim.now)
        sim._retime(dst)
        sim.r.migrations += 1


def requeue(sim, task: Task) -> None:
    """A shed or lost group goes back to the head of its step's queue."""
    sim.waiting.setdefault(task.step, deque()).appendleft(task)
    sim._want_placement()


def shed(sim, inst: Instance, held: int = 0) -> int:
    """The scheduler takes back the newest rollouts of a worker over its offer that another worker has
    room for now, less `held` sequences shed earlier this tick and not yet placed (they resume there,
    without affinity back); the rest stay and run slower. Returns the sequences shed."""
    running = [InFlight(t.key, t.width, t.placed_at, t.min_version) for t in inst.decoding.values()]
    roles = ROLES_OF_POLICY[PLACE_POLICY[sim.policy]]
    others = [WorkerSlot(i.addr, i.role, i.slots, i.used, i.version) for i in sim.insts.values()
              if i is not inst and i.role in roles and i.up and not i.asleep and i.factor < PAUSED]
    width = 0
    for key in plan_shed(running, inst.slots - (inst.used - sum(r.width for r in running)), others, held):
        task = inst.tasks[key]
        inst.remove(task, sim.now)
        task.sheds += 1
        sim.r.sheds += 1
        width += task.width
        requeue(sim, task)
    return width


def serving_tick(sim, tick: int) -> None:
    fleet, cfg = sim.plat.fleet, sim.cfg
    rates = sim.load.at(tick)
    n = np.array([inst.n_eff for inst in sim.serving])
    b, _, s_ms = fleet.load(rates, n)
    mem_slots, kv_frac = fleet.memory_slots(p99(b))
    caps = fleet.controller.caps
    ok_count = 0
    shed_width = 0  # sequences shed this tick: placed only after it, so they hold room elsewhere until then
    for i, inst in enumerate(sim.serving):
        inst.advance(sim.now)
        if sim.policy == "ideal":
            # The bound: serving needs s_ms of every TPOT budget; rollout gets the rest, and the memory.
            share = min(0.95, s_ms[i] / cfg.tpot_ms)
            inst.serving_ms, inst.factor, slots = 0.0, 1.0 / (1.0 - share), int(mem_slots[i])
        else:
            inst.serving_ms = float(s_ms[i])
            decodes = inst.decodes = int(round(b[i]))
            slots = min(fleet.offer(decodes), int(mem_slots[i]))
            if kv_frac[i] >= caps.sleep_at and not inst.asleep:
                inst.asleep = True
                sim.r.sleeps += 1
            elif inst.asleep and kv_frac[i] <= caps.wake_at and inst.addr not in sim.waking:
                sim.waking.add(inst.addr)
                sim._at(sim.now + inst.cost.wake_s, "woken", inst.addr)
            if inst.asleep:
                slots = 0
            res = fleet.kept(decodes, slots)
            sim.r.slo_windows += 1
            sim.r.slo_violations += not res[0]
            sim.r.slo_violations_alone += not res[1]
            ok_count += res[0]
        inst.slots = slots
        if inst.used > slots:
            shed_width += shed(sim, inst, shed_width)
        sim._retime(inst)
    if sim.policy != "ideal" and sim.serving:
        sim.r.attainment.append((sim.now, ok_count / len(sim.serving)))
        sim.r.offer.append((sim.now, float(np.mean([i.slots for i in sim.serving]))))
    sim._want_placement()


def scale_elastic(sim) -> None:
    ecfg = sim.elastic_cfg
    waiting = sum(t.width for q in sim.waiting.values() for t in q)
    held = [i for i in sim.insts.values() if i.kind == "elastic"]
    if waiting or any(i.tasks for i in sim.insts.values()):
        sim.last_busy = sim.now
    want = elastic_target(waiting, len(held), sim.arriving, sim.now - sim.last_busy, ecfg)
    for _ in range(want - len(held) - sim.arriving):
        inst = Instance(f"cloud/{next(sim.elastic_ids)}", "elastic", "dedicated", "cloud", sim.plat.roll,
                        sim.plat.roll.max_seqs, sim.now)
        inst.up = False
        fetch = inst.cost.weight_bytes / (sim.cfg.inter_gbit * 1e9 / 8)  # its first weights, dense
        delay = ecfg.allocation_delay_s
        if delay > 0 and not sim.cfg.allocation_delay_fixed:
            delay = sim.rng.exponential(delay)
        sim.arriving += 1
        sim._at(sim.now + delay + inst.cost.cold_start_s + fetch, "up", inst)
    if want < len(held):
        for inst in [i for i in held if not i.tasks][:len(held) - want]:
            retire(sim, inst)


def instance_up(sim, inst: Instance) -> None:
    sim.arriving -= 1
    inst.up, inst.t, inst.born, inst.version = True, sim.now, sim.now, sim.version
    sim.insts[inst.addr] = inst
    if sim.cfg.preempt_mean_s > 0:
        sim._at(sim.now + sim.rng.exponential(sim.cfg.preempt_mean_s), "preempted", inst.addr)
    sim._want_placement()


def retire(sim, inst: Instance) -> None:
    inst.advance(sim.now)
    del sim.insts[inst.addr]
    inst.up = False
    sim.retired.append((inst, sim.now))


def preempt(sim, addr: str) -> None:
    """A spot instance is taken back: its rollouts start over elsewhere (the worker is gone)."""
    inst = sim.insts.get(addr)
    if inst is None:
        return
    for task in list(inst.tasks.values()):
        inst.remove(task, sim.now)
        task.left, task.extra_s = task.tokens, 0.0
        requeue(sim, task)
    sim.r.preemptions += 1
    retire(sim, inst)
