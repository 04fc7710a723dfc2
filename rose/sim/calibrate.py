"""Calibration: simulate this host's `elastic_e2e` setups with its measured CPU profile and compare
with the measured runs (benchmarks/sim/e2e_runs.jsonl: one JSON row per run, as elastic_e2e prints).

Two figures are fitted, neither on the runs being predicted: the per-turn overhead of the agent loop
(the Dask task, the engine loop thread and the environment between two turns), as `env_latency_s`,
on the fixed synchronous runs' rollout phase; and the co-serving executor's per-iteration overhead
(`coserve_overhead_ms`) on `benchmarks/coserve_slo.py`'s measured harvest. Measured with the profile
and taken as they are: the TPOT margin coserve_slo's serving worker learnt and the step-time lines its
controller learnt (a co-served step's cost, as the runtime predicts it); how well a trainer and an engine
time-share one core (a microbenchmark, `measure_cpu.sharing`); and the contention between the two cores,
from ideal's asynchronous runs (so those are not an independent check). Every other
policy and mode is a prediction. Each is simulated twice: with the profile's measured contention between the two cores
(the trainer slows down while the other core runs rollouts) and without it; the difference between
the two, and what is left between the simulation and the measurement, say how much of the 2-core
figure is the cores getting in each other's way.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import replace

import numpy as np

from rose.sim.cluster import Simulation
from rose.sim.config import SimConfig
from rose.sim.costs import load_cpu_profile
from rose.sim.platform import build
from rose.sim.serving import RequestShape

# elastic_e2e's default pipeline (guess: 16 groups of 8, up to 5 turns of a few tokens) and setups, no tail
# migration; `calibrate` sets the serving rate to the one the measured rose runs served (33 req/s where they
# do not say), the rollout steps beside a serving step to those of the runtime the runs were made with, and
# the TPOT margin to the one the host's serving worker ended with (both from the profile).
GUESS = SimConfig(name="elastic_e2e", platform="cpu", job_gpus=1, serving_gpus=1, steps=12, prompts=16,
                  group_size=8, turns_min=1, turns_max=5, tokens_per_turn=3.0, length_sigma=0.0, max_tokens=20,
                  prompt_tokens=10, env_latency_s=0.0, trace="azure", serving_rps=33.0, serving_token_scale=0.03,
                  ttft_ms=300.0, tpot_ms=30.0, elastic_max_gpus=1, allocation_delay_s=15.0,
                  allocation_delay_fixed=True, idle_release_s=60.0, max_num_seqs=64, load_tick_s=1.0, tick_s=0.05)
SETUPS = {  # (elastic_e2e policy, staleness) -> simulator policy and settings
    ("fixed", 0): dict(policies=("fixed_sync",), max_num_seqs=256, serving_gpus=0),
    ("fixed", 1): dict(policies=("fixed_async",), max_num_seqs=256, serving_gpus=0),
    ("rose", 1): dict(policies=("rose",), colocated=True, staleness=1),
    ("rose", 0): dict(policies=("rose",), colocated=True, staleness=0),
    ("ideal", 1): dict(policies=("ideal",), colocated=True, staleness=1, trace="none"),
    ("ideal", 0): dict(policies=("ideal",), colocated=True, staleness=0, trace="none"),
    ("elastic", 1): dict(policies=("elastic",), colocated=True, staleness=1, serving_gpus=0, steps=40),
}


def load_runs(path: str) -> dict:
    runs: dict = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                runs.setdefault((r["policy"], r["staleness"]), []).append(r)
    return runs


def _sim(cfg: SimConfig):
    return Simulation(cfg, cfg.policies[0]).run()


def fit_turn_overhead(base: SimConfig, measured_rollout_s: float) -> float:
    """The per-turn overhead (s) that makes the simulated fixed synchronous rollout phase the measured one."""
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        r = _sim(replace(base, env_latency_s=mid, **SETUPS[("fixed", 0)]))
        if statistics.fmean(r.rollout_s[1:]) < measured_rollout_s:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# benchmarks/coserve_slo.py --quick: the Azure trace (prompts x0.03 up to 48 tokens, outputs x0.1 up to 32),
# SLO 300 / 30 ms, both workers held to 64 sequences. Its harvest comes with the profile where
# measure_cpu.py --run measured it; else the 87a0f42 run (RESULTS.md: 0.312 at 70 req/s).
COSERVE_HARVEST, COSERVE_RATE, COSERVE_SEQS = 0.312, 70.0, 64


def measured_harvest() -> tuple[float, float]:
    """(harvest, req/s) that the co-serving overhead is fitted on."""
    prof = load_cpu_profile()
    return (prof.coserve_harvest, prof.coserve_rate) if prof.coserve_harvest > 0 else (COSERVE_HARVEST, COSERVE_RATE)


def harvest(base: SimConfig, overhead_ms: float, rate: float = COSERVE_RATE) -> float:
    """The simulated co-served over dedicated rollout throughput in coserve_slo's setup at `rate` req/s."""
    cfg = replace(base, coserve_overhead_ms=overhead_ms, serving_rps=rate)
    plat = build(cfg, np.random.default_rng([cfg.seed, 0]))
    fleet = plat.fleet
    full = fleet.shape
    fleet.shape = RequestShape(min(48.0, full.prompt_mean / base.serving_token_scale * 0.03),
                               48.0, min(32.0, full.gen_mean / base.serving_token_scale * 0.1))
    n = np.array([float(COSERVE_SEQS)])
    for _ in range(10):
        b, _, s_ms = fleet.load(np.array([rate]), n)
        n = np.array([float(min(COSERVE_SEQS, fleet.offer(int(round(b[0])))))])
    co = n[0] / (s_ms[0] + fleet.rollout.decode_ms(n[0]))
    return float(co / (COSERVE_SEQS / plat.roll.decode_ms(COSERVE_SEQS)))  # over a dedicated worker's


def fit_coserve_overhead(base: SimConfig, target: float = COSERVE_HARVEST, rate: float = COSERVE_RATE) -> float:
    """The overhead (ms) whose simulated harvest is nearest `target`. Harvest steps down with the overhead
    (the offer is whole sequences), so the bisection ends at a step: the nearer of its two sides."""
    lo, hi = 0.0, 100.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if harvest(base, mid, rate) > target else (lo, mid)
    return min((lo, hi), key=lambda x: abs(harvest(base, x, rate) - target))


def calibrate(runs_path: str, base: SimConfig = GUESS) -> dict:
    runs = load_runs(runs_path)
    prof = load_cpu_profile()
    base = replace(base, coserve_steps=prof.coserve_steps)
    margin = prof.coserve_margin
    if margin > 0:
        # The simulated controller learns its margin from lognormal step noise; this host's periods swing
        # more (other processes, the interpreter), so the margin its serving worker learnt is used.
        base = replace(base, slo_margin=margin, slo_learn_margin=False)
    rates = {r["rate"] for rs in runs.values() for r in rs if "rate" in r}
    if len(rates) > 1:
        raise ValueError(f"{runs_path}: rose runs at different serving rates {sorted(rates)}; calibrate one set")
    if rates:  # elastic_e2e's runs say the rate they served (a share of the capacity measured with them)
        base = replace(base, serving_rps=float(rates.pop()))
    fixed = runs.get(("fixed", 0))
    if not fixed:
        raise ValueError(f"{runs_path}: no fixed synchronous run to fit the per-turn overhead on")
    overhead = fit_turn_overhead(base, statistics.fmean(r["rollout_s"] for r in fixed))
    target, rate = measured_harvest()
    coserve = fit_coserve_overhead(base, target, rate)
    base = replace(base, env_latency_s=overhead, coserve_overhead_ms=coserve)
    rows = []
    for key, setup in SETUPS.items():
        if key not in runs:
            continue
        measured = [r["traj_s"] for r in runs[key]]
        cfg = replace(base, **setup)
        with_c, without_c = _sim(cfg), _sim(replace(cfg, contention=False))
        m = statistics.fmean(measured)
        rows.append({"policy": key[0], "mode": "async" if key[1] else "sync", "runs": len(measured),
                     "measured_traj_s": round(m, 2),
                     "measured_range": [round(min(measured), 1), round(max(measured), 1)],
                     "sim_traj_s": round(float(with_c.throughput), 2),
                     "sim_no_contention_traj_s": round(float(without_c.throughput), 2),
                     "error": round(float(abs(with_c.throughput - m) / m), 3),
                     "error_no_contention": round(float(abs(without_c.throughput - m) / m), 3),
                     "measured_rollout_s": round(statistics.fmean(r["rollout_s"] for r in runs[key]), 3),
                     "sim_rollout_s": round(float(statistics.fmean(with_c.rollout_s[1:])), 3),
                     "measured_train_s": round(statistics.fmean(r["train_s"] for r in runs[key]), 3),
                     "sim_train_s": round(float(statistics.fmean(with_c.train_s)), 3)})
    return {"turn_overhead_s": round(overhead, 5), "coserve_overhead_ms": round(coserve, 3), "tpot_margin": margin,
            "coserve_harvest": round(harvest(base, coserve, rate), 3), "measured_harvest": target, "rows": rows,
            "calibration_error": max(r["error"] for r in rows),
            "calibration_error_mean": round(statistics.fmean(r["error"] for r in rows), 3)}
