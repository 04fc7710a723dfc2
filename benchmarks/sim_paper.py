"""Claim: at cluster scale, in the simulator that runs the runtime's own placement policy, SLO
controller, elastic scaler, DAPO driver decision and sync planner, ROSE reproduces the published
results and goes beyond them. Targets over benchmarks/sim/paper.toml: rose's end-to-end speed-up over
the best resource-fixed policy spans 1.3-3.3 and reaches 3.5 in at least one realistic setup;
elastic's rollout phase over rose's spans 1.2 to 1.6 or more; rose keeps at least 0.8 of ideal's
gain (`fraction_of_ideal_min`); no serving SLO violation; rose's allocation overhead at most 0.005
of the run; the simulator calibrated on this host's measured runs within 0.2 (`calibration_error`);
4,096 GPUs x 100 steps simulated in under 120 s here.

Every setup runs under every policy (fixed_sync, fixed_async, elastic, rose, ideal), each
asynchronous policy at every listed split of the job's GPUs between training and rollout, keeping
its best: the baselines get the split that suits them. The calibration simulates this host's
benchmarks/elastic_e2e.py setups with the CPU profile measured here (benchmarks/sim/cpu_profile.json)
and compares with the measured runs in benchmarks/sim/e2e_runs.jsonl (rose.sim.calibrate). `--quick`:
24 of the 48 setups (paper scale at 256 prompts, both links and loads; the 16 + 256 fleet; 8 and 32
GPUs), 8 steps, four splits (0.5, 0.75, 0.875, 0.9375). A split counts whole rollout instances: where
the share left over cannot hold one (32B-class models take 4 GPUs), every job GPU trains and the
policies with capacity outside the job (elastic, rose, ideal) roll out only there.

    python benchmarks/sim_paper.py [--quick] [--jobs 2] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rose.sim import SimConfig, Simulation, load_matrix  # noqa: E402
from rose.sim.calibrate import calibrate  # noqa: E402
from rose.sim.compare import compare  # noqa: E402
from rose.sim.report import headline, table, write  # noqa: E402

PAPER = os.path.join(ROOT, "benchmarks", "sim", "paper.toml")
RUNS = os.path.join(ROOT, "benchmarks", "sim", "e2e_runs.jsonl")


def quick_subset(configs: list[SimConfig]) -> list[SimConfig]:
    def keep(c: SimConfig) -> bool:
        if c.name.startswith(("8b[", "32b[")):
            return c.prompts == 256
        return c.name.startswith(("fleet272", "scale8[", "scale32["))
    return [replace(c, steps=min(c.steps, 8), train_fractions=(0.75, 0.875, 0.9375)) for c in configs if keep(c)]


def one(cfg: SimConfig):
    t0 = time.perf_counter()
    c = compare(cfg)
    return c, time.perf_counter() - t0


# What each of ROSE's extensions contributes: rose as the runtime runs by default, then with one switch
# changed at a time (tail migration is off by default, so it is switched
# on), on two paper-scale setups at the slow 20 Gbit/s link (where sync matters) and a tail-bound one
# where ideal gains least, rose's best split there.
ABLATIONS = (("defaults", {}), ("synchronous (staleness 0)", {"staleness": 0}),
             ("one rollout step a serving step", {"coserve_steps": 1}),
             ("at most 8 rollout steps a serving step", {"coserve_steps": 8}),
             ("fixed TPOT margin (15 %)", {"slo_learn_margin": False}),
             ("tail migration on", {"migrate_tail": True}),
             ("dense sync", {"sparse_sync": False}),
             ("no relays", {"relays": False}), ("dense sync, no relays", {"sparse_sync": False, "relays": False}))
ABLATED = ("8b[algorithm=grpo-prompts=1024-inter_gbit=20.0-serving_rps=8.0]",
           "32b[algorithm=dapo-prompts=1024-inter_gbit=20.0-serving_rps=2.0]",
           "8b[algorithm=dapo-prompts=256-inter_gbit=200.0-serving_rps=8.0]")  # tail-bound: the margin matters


def ablate(cfg: SimConfig, split: float) -> list[tuple[str, dict]]:
    out = []
    for label, change in ABLATIONS:
        r = Simulation(replace(cfg, train_fraction=split, policies=("rose",), **change), "rose").run()
        out.append((label, r.summary()))
    return out


def timing_4096(steps: int = 100) -> tuple[float, dict]:
    """Wall time of one rose run of the 4,096-GPU setup for `steps` steps (this host, one core)."""
    cfg = next(c for c in load_matrix(PAPER) if c.name == "scale4096[algorithm=grpo]")
    cfg = replace(cfg, steps=steps, train_fraction=0.875, policies=("rose",))
    t0 = time.perf_counter()
    r = Simulation(cfg, "rose").run()
    return time.perf_counter() - t0, r.summary()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="24 setups, 8 steps, four splits (a few minutes)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="setups simulated at once")
    ap.add_argument("--config", default=PAPER)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "sim-paper"))
    args = ap.parse_args()
    configs = load_matrix(args.config)
    if args.quick:
        configs = quick_subset(configs)
    t0 = time.perf_counter()
    print(f"sim_paper: {len(configs)} setups x {len(SimConfig().policies)} policies, {args.jobs} at once",
          file=sys.stderr, flush=True)
    comps = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for i, (c, wall) in enumerate(pool.map(one, configs), 1):
            comps.append(c)
            print(f"\n[{i}/{len(configs)}, {wall:.1f} s]\n{table(c)}", flush=True)
    sweep_s = time.perf_counter() - t0
    cal = calibrate(RUNS)
    print("\ncalibration against this host's elastic_e2e runs (benchmarks/sim/e2e_runs.jsonl): fitted per-turn "
          f"overhead {cal['turn_overhead_s'] * 1e3:.1f} ms, co-serving iteration overhead "
          f"{cal['coserve_overhead_ms']:.1f} ms")
    print(f"{'policy':<9}{'mode':<7}{'measured traj/s':>17}{'range':>15}{'sim':>8}{'sim, no contention':>20}"
          f"{'error':>8}{'rollout s meas/sim':>20}{'train s meas/sim':>18}")
    for r in cal["rows"]:
        print(f"{r['policy']:<9}{r['mode']:<7}{r['measured_traj_s']:>17.1f}{str(r['measured_range']):>15}"
              f"{r['sim_traj_s']:>8.1f}{r['sim_no_contention_traj_s']:>20.1f}{r['error']:>8.3f}"
              f"{r['measured_rollout_s']:>10.2f}/{r['sim_rollout_s']:<9.2f}{r['measured_train_s']:>8.2f}/"
              f"{r['sim_train_s']:<9.2f}")
    by_name = {c.config.name: c for c in comps}
    for name in ABLATED:
        cfg = by_name[name].config if name in by_name else next(c for c in load_matrix(args.config) if c.name == name)
        split = by_name[name].splits["rose"] if name in by_name else 0.75
        rows = ablate(replace(cfg, steps=min(cfg.steps, 8)) if args.quick else cfg, split)
        base = rows[0][1]["traj_per_s"]
        print(f"\nextensions, one changed at a time: {name} (rose, split {split:g})")
        print(f"{'':<40}{'traj/s':>8}{'x default':>10}{'rollout s':>11}{'sync s':>8}{'sheds':>7}{'moved':>7}")
        for label, s in rows:
            print(f"{label:<40}{s['traj_per_s']:>8.2f}{s['traj_per_s'] / base:>10.3f}{s['rollout_s']:>11.1f}"
                  f"{s['sync_s']:>8.1f}{s['sheds']:>7}{s['migrations']:>7}")
    t4096, s4096 = timing_4096()
    print(f"\n4,096 GPUs x 100 steps (rose, {s4096['sim_s'] / 3600:.1f} h simulated): {t4096:.1f} s here")
    paths = write(comps, args.out)
    print(f"wrote {', '.join(paths)}; the sweep took {sweep_s:.0f} s", file=sys.stderr)
    head = headline(comps)
    best = max(comps, key=lambda c: c.speedup() or 0)
    print(f"\nspeed-up over the best fixed policy {head['speedup_vs_fixed_min']}-{head['speedup_vs_fixed_max']} "
          f"(highest: {best.config.name}); elastic/rose rollout {head['rollout_time_elastic_over_rose_min']}-"
          f"{head['rollout_time_elastic_over_rose_max']}; fraction of ideal >= {head['fraction_of_ideal_min']}; "
          f"SLO violations {head['slo_violations']}; allocation overhead rose <= {head['allocation_overhead_max']}, "
          f"elastic {head['allocation_overhead_elastic_min']}-{head['allocation_overhead_elastic_max']}\n")
    print(json.dumps({"bench": "sim_paper", **{k: head[k] for k in (
        "configs", "speedup_vs_fixed_min", "speedup_vs_fixed_max", "rollout_time_elastic_over_rose_min",
        "rollout_time_elastic_over_rose_max", "fraction_of_ideal_min", "slo_violations", "allocation_overhead_max")},
        "calibration_error": cal["calibration_error"], "sim_seconds_4096gpu_100steps": round(t4096, 1),
        "allocation_overhead_elastic_min": head["allocation_overhead_elastic_min"],
        "allocation_overhead_elastic_max": head["allocation_overhead_elastic_max"],
        "calibration_error_mean": cal["calibration_error_mean"], "quick": args.quick}))


if __name__ == "__main__":
    main()
