"""Run one setup under every policy and compare them (what `rose sim` and the benchmark tabulate).

Each asynchronous policy tries every split of the job's GPUs between training and rollout that the
config lists and keeps its best, so no policy loses to a split chosen for another. Comparisons:
- speed-up: rose's throughput over the best resource-fixed policy's (and over each one);
- rollout time: elastic's mean rollout phase over rose's;
- fraction of ideal: rose's gain over fixed against ideal's gain, (rose - fixed) / (ideal - fixed),
  reported where ideal gains at least 5 % (below that the bound leaves nothing to reach for).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from rose.sim.cluster import Simulation
from rose.sim.config import SimConfig
from rose.sim.result import SimResult

FIXED = ("fixed_sync", "fixed_async")


@dataclass
class Comparison:
    config: SimConfig
    results: dict  # policy -> SimResult (its best split)
    splits: dict  # policy -> share of the job's GPUs that trained in its best run

    def _tp(self, p: str) -> float | None:
        r = self.results.get(p)
        return r.throughput if r is not None else None

    @property
    def fixed(self) -> float | None:
        vals = [self._tp(p) for p in FIXED if p in self.results]
        return max(vals) if vals else None

    def speedup(self, over: str | None = None) -> float | None:
        base = self.fixed if over is None else self._tp(over)
        rose = self._tp("rose")
        return rose / base if rose and base else None

    def elastic_rollout_ratio(self) -> float | None:
        e, r = self.results.get("elastic"), self.results.get("rose")
        if not e or not r:
            return None
        return mean_rollout(e) / mean_rollout(r)

    def fraction_of_ideal(self) -> float | None:
        f, r, i = self.fixed, self._tp("rose"), self._tp("ideal")
        if None in (f, r, i) or i < 1.05 * f:
            return None
        return (r - f) / (i - f)

    def row(self) -> dict:
        def rnd(x, n=3):
            return None if x is None else round(x, n)
        r = self.results.get("rose")
        return {"config": self.config.name, **{f"{p}_traj_s": rnd(self._tp(p), 2) for p in self.results},
                "speedup_vs_fixed": rnd(self.speedup()),
                **{f"speedup_vs_{p}": rnd(self.speedup(p)) for p in FIXED if p in self.results},
                "rollout_time_elastic_over_rose": rnd(self.elastic_rollout_ratio()),
                "fraction_of_ideal": rnd(self.fraction_of_ideal()),
                "slo_violations": r.slo_violations if r else None,
                "slo_violations_alone": r.slo_violations_alone if r else None,
                "allocation_overhead_rose": rnd(r.allocation_overhead, 5) if r else None,
                "allocation_overhead_elastic": rnd(self.results["elastic"].allocation_overhead, 4)
                if "elastic" in self.results else None,
                "splits": self.splits}


def mean_rollout(r: SimResult) -> float:
    """Mean rollout phase over steps 1.. (step 0 starts cold)."""
    xs = r.rollout_s[1:] or r.rollout_s
    return sum(xs) / max(1, len(xs))


def compare(cfg: SimConfig, progress=None) -> Comparison:
    results, splits = {}, {}
    for policy in cfg.policies:
        fractions = [cfg.train_fraction] if policy == "fixed_sync" or cfg.colocated else \
            sorted({cfg.train_fraction, *cfg.train_fractions})
        best, seen = None, set()
        for f in fractions:
            sim = Simulation(replace(cfg, train_fraction=f), policy)
            if sim.split in seen:  # whole rollout instances: another fraction gave this split already
                if progress:
                    progress(cfg, policy, f, None)
                continue
            seen.add(sim.split)
            r = sim.run()
            if progress:
                progress(cfg, policy, f, r)
            share = round(sim.split.train_gpus / cfg.job_gpus, 4)  # the split as run
            if best is None or r.throughput > best[1].throughput:
                best = (share, r)
        splits[policy], results[policy] = best
    return Comparison(cfg, results, splits)
