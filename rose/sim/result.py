"""What one simulated run measured, and the accounting checks it must pass."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SimResult:
    config: str
    policy: str
    # per step
    step_end: list = field(default_factory=list)  # when each train step ended (s of simulated time)
    rollout_s: list = field(default_factory=list)  # first placement to last group done, per step (s)
    train_s: list = field(default_factory=list)
    sync_s: list = field(default_factory=list)  # publish until every receiver holds the version (s)
    demand: list = field(default_factory=list)  # groups rolled out per step
    # serving
    slo_windows: int = 0  # (serving instance, load tick) pairs checked
    slo_violations: int = 0  # of them, where serving's p99 TTFT or TPOT missed its SLO beside rollout
    slo_violations_alone: int = 0  # where it would have missed with no rollout at all (the load alone)
    attainment: list = field(default_factory=list)  # (time, share of serving instances within SLO)
    offer: list = field(default_factory=list)  # (time, mean rollout slots a serving instance offers)
    sleeps: int = 0  # times a serving GPU's rollout engine slept for serving's memory
    # rollout
    tasks_created: int = 0
    tasks_done: int = 0
    duplicates: int = 0  # groups that finished a second time (must stay 0)
    trained_trajectories: int = 0
    sheds: int = 0
    preemptions: int = 0
    migrations: int = 0  # groups moved off serving GPUs at a step's tail
    placements: dict = field(default_factory=dict)  # reason -> placed tasks
    placement_calls: int = 0
    placement_cpu_s: float = 0.0  # wall time spent in the real `place` (s, this host)
    alloc_wait_s: float = 0.0  # simulated time work waited while capacity was being allocated or woken
    bytes_moved: float = 0.0
    # filled by finish()
    total_s: float = 0.0
    throughput: float = 0.0  # trajectories a second over steps 1..N-1
    allocation_overhead: float = 0.0  # share of the run spent waiting for capacity being set up
    gpu_hours: dict = field(default_factory=dict)
    accounting_error_s: float = 0.0  # max over instances |busy + env + idle - time up|
    leftover_tasks: int = 0  # placed or waiting at the end (a finished run has none of the last step's)
    wall_s: float = 0.0

    def finish(self, sim, wall_s: float) -> None:
        self.wall_s = wall_s
        self.total_s = sim.now
        ends = self.step_end
        if len(ends) >= 2:
            per_step = sim.cfg.prompts * sim.cfg.group_size
            self.throughput = per_step * (len(ends) - 1) / (ends[-1] - ends[0])
        elif ends:
            self.throughput = sim.cfg.prompts * sim.cfg.group_size / ends[0]
        insts = [(i, sim.now) for i in sim.insts.values()] + list(sim.retired)
        self.allocation_overhead = (self.alloc_wait_s + self.placement_cpu_s) / sim.now if sim.now > 0 else 0.0
        tp = sim.plat.tp
        elastic_h = sum((gone - inst.asked_at) for inst, gone in insts if inst.kind == "elastic") * tp / 3600
        borrowed = sum(inst.busy_s - inst.serving_busy_s for inst, _ in insts if inst.kind == "serving") * tp / 3600
        self.gpu_hours = {"job": sim.cfg.job_gpus * sim.now / 3600, "elastic": elastic_h, "serving_borrowed": borrowed}
        self.accounting_error_s = max((abs(i.busy_s + i.env_s + i.idle_s - (gone - i.born)) for i, gone in insts),
                                      default=0.0)
        self.leftover_tasks = sum(len(q) for q in sim.waiting.values()) + sum(len(i.tasks) for i in sim.insts.values())

    def summary(self) -> dict:
        n = len(self.rollout_s)
        return {
            "config": self.config, "policy": self.policy, "steps": len(self.step_end),
            "traj_per_s": round(self.throughput, 3),
            "rollout_s": round(sum(self.rollout_s[1:]) / max(1, n - 1), 2) if n > 1 else (self.rollout_s or [0])[0],
            "train_s": round(sum(self.train_s) / max(1, len(self.train_s)), 2),
            "sync_s": round(max(self.sync_s, default=0.0), 2),
            "demand_max_over_min": round(max(self.demand) / max(1, min(self.demand)), 2) if self.demand else 0,
            "slo_violations": self.slo_violations, "slo_violations_alone": self.slo_violations_alone,
            "slo_windows": self.slo_windows, "sheds": self.sheds, "migrations": self.migrations,
            "preemptions": self.preemptions, "sleeps": self.sleeps, "placement_calls": self.placement_calls,
            "bytes_moved_gb": round(self.bytes_moved / 1e9, 1),
            "allocation_overhead": round(self.allocation_overhead, 5),
            "gpu_hours": {k: round(v, 2) for k, v in self.gpu_hours.items()},
            "sim_s": round(self.total_s, 1), "wall_s": round(self.wall_s, 2),
        }
