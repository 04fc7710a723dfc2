"""Claim: borrowing a serving worker's spare capacity speeds RL training up end to end, against the same
pipeline on fixed resources and on elastically added resources, while the serving worker keeps its
SLOs (targets: speedup_vs_fixed >= 1.5, fraction_of_ideal >= 0.75, slo_attainment >= 0.99).

The default pipeline (pipelines/guess.py: 16 groups of 8 trajectories a step, GRPO, weight sync) runs
for the same number of steps, same seed, under four setups, each run on a fresh LocalRoseCluster (real
scheduler with rose.plugin, real worker processes, vLLM). This host has two cores. The RL job owns
core 0: its trainer and one dedicated rollout worker share it, as a colocated trainer and rollout
engine share a device. This process (the driver, the Dask scheduler, the nannies: the job's control
plane) is bound to core 0 too (`--driver-anywhere` leaves it free): left free, the OS ran it on core 1
beside the serving worker in rose's runs, and in A/B pairs on one host (--quick, each pair at one --rate
and --capacity, 2026-12-06) rose's speed-up over fixed was 1.43-1.49 bound and 1.28-1.34 free in a fast
hour, 1.13 and 1.11 in a slow one. Core 1 stands for capacity outside the job:
- fixed: nothing more; core 0 only. The dedicated worker runs all of a step's rollouts at once.
- elastic: the dedicated worker takes --dedicated-slots sequences at once; what waits makes the
  scaler ask for an on-demand dedicated worker (core 1, up to 1, --serving-seqs slots: the serving
  worker's), which starts after --allocation-delay seconds and then builds its engine and catches up
  on the weights, all inside the run. Elastic runs --elastic-steps steps, long enough that this wait
  is a stated fraction of its timed window: `allocation_overhead`, the fraction of the timed window
  from the scaler's request (or the window's start, if later) to the on-demand worker's first rollout
  (allocation delay + engine build + weight catch-up), read from the placement plugin's samples.
- rose: core 1 is a serving worker serving the Azure conversation trace through its HTTP endpoint at
  a fixed --rate the whole time; the dedicated worker takes --dedicated-slots sequences and rollouts
  overflow to the serving worker (at most --serving-seqs sequences) as its spare capacity allows.
- ideal: the bound rose reaches for: core 1 given to a second dedicated rollout worker from the
  start, with the serving worker's --serving-seqs slots, and no serving traffic.
The serving rate is fixed for every rose run of an invocation (not a fraction of a per-run measurement),
so they compare: by default 15 % of the serving worker's capacity, measured once, at the first rose run's
start, before the RL job attaches (closed-loop clients, `traffic.capacity`, against the idle serving
worker, 8 s; the clients run in this process, so on core 0 unless --driver-anywhere, and the serving
worker has core 1 to itself while it is measured). A constant measured on one host (220 req/s, 2026-12-01) put 33 req/s on a later host where
the same measurement gave 108 req/s (coserve_slo, 2026-12-02) and serving steps took 0.29-0.65 of the
serving worker's time in rose's runs. Pass --rate and --capacity to hold both across invocations (an
A/B of two commits).
`serving_load` = rate / capacity, and

    fraction_of_ideal = (rose - fixed) / ((ideal - fixed) * (1 - serving_load))

(rose's gain over fixed against the gain of the spare core, net of the share serving keeps). The SLO
is tight by default, coserve_slo's: TTFT 300 ms / TPOT 30 ms (there 18x / 5x the p99s of serving
alone, 16 / 6 ms; the old 1000 / 100 ms left serving's TPOT p99 at 50-57 ms here and bound nothing).
The co-serving controller keeps each rollout step inside the TPOT budget, so the SLO sets how much
of core 1 rose's rollouts get: the table shows the slots core 1's worker offered and the sequences
placed on it (means over the timed window while it was connected; building its engine, it offers none),
and the share of the timed window core 1's worker spent in rollout engine steps and in serving engine
steps (its engines' own step timers). Serving at 15 % of its closed-loop capacity took 26-29 % of core 1
in serving steps alone (AMX host, 2026-12-06): a serving step's cost is mostly fixed, and one runs every
period. The JSON also gives core 1's CPU: the serving worker's process took 0.90-0.91 of it in rose's
timed windows (rollout steps 0.47-0.49, serving steps 0.26-0.29, the rest its executor's own work, the
agent loops, the front end and Dask) and the traffic client 0.09-0.10: core 1 was saturated (the runs
at 4790ca8, 2026-12-06).

Each setup runs synchronously (step k's rollouts, then its training) and/or asynchronously
(`staleness=1`: step k+1's rollouts during step k's training). Asynchronously, the dedicated worker
yields core 0 to the trainer while it trains (`--rose-colocated`) under elastic, rose and ideal; fixed
has no other rollout capacity, so its asynchronous run lets the OS share core 0 instead. This host's
speed drifts over minutes, so every run is made twice, in mirrored order (A B C ... C B A): a steady
drift cancels in each mode's mean. Each policy's figure is its best mode's mean; speed-ups are against
the best fixed mode's. `--quick` runs 12 steps and only the modes the headline is made of (fixed sync,
rose async, ideal async), still mirrored; it leaves out fixed async, rose sync, ideal sync and elastic
(whose run must be long). Throughput is trajectories per second over steps 1..N-1 (step 0 warms up),
timed from the end of step 0 to the end of the last step; rollout time is the mean rollout phase of
those steps (asynchronously it overlaps the previous step's training). The serving SLO attainment is
measured by the load generator (client side; a process of its own at a raised priority, standing for
users on other machines: benchmarks/support/traffic_process.py) during the rose runs, over the same
timed window (`slo_attainment`) and over the whole run (`slo_attainment_run`): the run adds the job's
start, where the serving worker builds its rollout engine and holds serving for that long.

    python benchmarks/elastic_e2e.py [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.support.traffic_process import TrafficProcess  # noqa: E402
from rose.runtime.cluster import LocalRoseCluster  # noqa: E402
from rose.runtime.coserve import traffic  # noqa: E402
from rose.runtime.coserve.traffic import LoadReport  # noqa: E402
from rose.runtime.worker.process import bind_to_cores  # noqa: E402

LOAD = 0.15  # the serving worker's default request rate, as a share of its measured capacity
CAPACITY_S = 8.0  # seconds of closed-loop requests that measure it


class BenchCluster(LocalRoseCluster):
    """LocalRoseCluster plus `spare_slots`: rollout sequences of a dedicated worker off the trainer's
    cores (core 1: ideal's second dedicated worker), where ClusterConfig.dedicated_slots holds every
    dedicated worker to one count. The extra `--rose-slots` comes last on the worker's command line,
    so it wins. (On-demand workers take ElasticConfig.worker_slots.)"""

    def __init__(self, config, engine, spare_slots: int | None = None):
        self.spare_slots = spare_slots
        super().__init__(config, engine)

    def _colocated(self, cores):
        own = super()._colocated(cores)
        if self.spare_slots and not self._trainer_cores & set(cores):
            return (*own, "--rose-slots", str(self.spare_slots))
        return own


def waited_for_capacity(asked_at: list[float], first_used: list[float], start: float, end: float) -> float:
    """Seconds of [start, end] during which an on-demand worker was asked for and ran no rollout yet.

    `asked_at[i]` pairs with the i-th on-demand worker's first rollout, `first_used[i]` (missing: it never
    ran one). Overlapping waits count once."""
    spans = sorted((a, first_used[i] if i < len(first_used) else end) for i, a in enumerate(asked_at))
    total, reach = 0.0, start
    for a, b in spans:
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total


def _samples(dask_scheduler) -> list[tuple]:
    """The placement plugin's samples of every rollout worker, 4 a second: (time on its monotonic clock,
    address, role, slots offered, sequences placed)."""
    return [(s.time, s.worker, s.role, s.slots, s.used) for s in dask_scheduler.plugins["rose"].book.history]


def core1_use(samples: list[tuple], core1: set[str], start: float, end: float) -> dict:
    """Core 1's rollout worker over the timed window: mean slots it offered and sequences placed on it."""
    mine = [s for s in samples if s[1] in core1 and start <= s[0] <= end]
    n = max(1, len(mine))
    return {"core1_slots": sum(s[3] for s in mine) / n, "core1_used": sum(s[4] for s in mine) / n}


def engine_seconds(dask_worker) -> dict | None:
    """Seconds this worker's engines have spent in their steps so far (wall time, read off the clock):
    `rollout` (a dedicated worker's engine loop, a serving worker's rollout engine) and `serving` (a
    serving worker's serving engine); and `cpu`, the worker process's CPU seconds (every thread: the
    steps, the executor's own work, the agent loops, the HTTP front end, Dask). None on a worker with no
    rollout engine (the trainer)."""
    from rose.runtime.worker.plugin import rose_worker_of

    w = rose_worker_of(dask_worker)
    host = w.host if w is not None else None
    executor = getattr(host, "executor", None)
    cpu = time.process_time()  # the worker process's CPU seconds, all its threads
    if executor is not None:  # a serving worker: its co-serving executor steps both engines
        c = executor.counters()
        return {"rollout": c["rollout_wall_ms"] / 1e3, "serving": c["serving_wall_ms"] / 1e3, "cpu": cpu}
    engine = getattr(host, "engine", None)
    if engine is not None and hasattr(engine, "counters"):
        return {"rollout": engine.counters()["busy_s"], "serving": 0.0, "cpu": cpu}
    return None


def core1_steps(first: dict, last: dict, core1: set[str], seconds: float) -> dict:
    """The share of the timed window (`seconds` long) core 1's worker spent in rollout engine steps and in
    serving engine steps, from `engine_seconds` read on every worker at the window's start (`first`) and
    end (`last`): what the rest of core 1 is left for (the co-serving executor's own work, the front end,
    the traffic client, Dask, and idle time); and the share of it the worker's process took in all
    (`core1_cpu_share`). A worker that joined during the window (elastic's on-demand one) counts from zero."""
    out = {"core1_rollout_share": 0.0, "core1_serving_share": 0.0, "core1_cpu_share": 0.0}
    for addr in core1 & set(last):
        a, b = first.get(addr) or {}, last[addr]
        if b is not None:
            out["core1_rollout_share"] += (b["rollout"] - a.get("rollout", 0.0)) / seconds
            out["core1_serving_share"] += (b["serving"] - a.get("serving", 0.0)) / seconds
            out["core1_cpu_share"] += (b["cpu"] - a.get("cpu", 0.0)) / seconds
    return out


def run_policy(name: str, pipeline, cluster_cfg, steps: int, args, staleness: int,
               spare_slots: int | None = None) -> dict:
    from distributed import Client

    import rose

    out = {"policy": name, "staleness": staleness, "steps": steps}
    stamps: list[float] = []
    with BenchCluster(cluster_cfg, pipeline.engine, spare_slots) as cluster, Client(cluster) as client:
        load = None
        if cluster_cfg.num_serving:
            (w,) = [w for w in client.scheduler_info(n_workers=-1)["workers"].values()
                    if w["metrics"]["rose"]["role"] == "serving"]
            url = f"http://127.0.0.1:{w['metrics']['rose']['http_port']}"
            if args.capacity is None:  # once, against the idle serving worker: no RL job has attached yet
                args.capacity = asyncio.run(traffic.capacity(url, CAPACITY_S))
                args.rate = args.rate or round(LOAD * args.capacity, 1)
                print(f"serving worker's capacity {args.capacity:.1f} req/s (closed loop, {CAPACITY_S:.0f} s); "
                      f"serving {args.rate:.1f} req/s in every rose run", file=sys.stderr, flush=True)
            # The users' client runs beside the serving worker, off the job's core (traffic_process.py).
            spare = set(cluster_cfg.cores or ()) - set(cluster_cfg.trainer_cores or ())
            load = TrafficProcess(url, args.trace, args.rate, args.ttft_ms, args.tpot_ms, args.seed,
                                  cores=tuple(sorted(spare)) or None)
        t0 = time.monotonic()
        engine_s: list[dict] = []  # `engine_seconds` of every worker at the timed window's start and end
        driver_cpu: list[float] = []  # this process's CPU seconds then (the scheduler, the nannies, the driver)
        client_cpu: list[float] = []  # the traffic client's CPU seconds then (rose)

        def read_engines(row):
            if row["step"] in (0, steps - 1):
                engine_s.append(client.run(engine_seconds))
                driver_cpu.append(time.process_time())
                if load is not None:
                    client_cpu.append(load.cpu_s())

        report = rose.run(replace(pipeline, cluster=cluster_cfg, staleness=staleness), cluster=client, steps=steps,
                          progress=False,
                          on_step=lambda row: (stamps.append(time.monotonic()), read_engines(row), print(
                              f"  step {row['step']}: rollout {row['rollout_s']:.2f} s, train {row['train_s']:.2f} s, "
                              f"sync {row['sync_s']:.2f} s, step {row['step_s']:.2f} s", file=sys.stderr, flush=True)))
        out["run_s"] = time.monotonic() - t0
        if load is not None:
            lr = load.stop()
            # Attainment over the timed window (requests sent from the end of step 0 to the end of the last
            # step), as throughput is; and over the whole run, which adds the job's start: preparing the
            # serving worker builds its rollout engine on the executor's thread (swaps.py), which holds
            # serving for the build's length, once per worker life.
            timed = [r for r in lr.results if stamps[0] <= load.started + r.arrival.t <= stamps[-1]]
            out.update(slo_attainment=LoadReport(timed, args.ttft_ms, args.tpot_ms).attainment,
                       slo_attainment_run=lr.attainment, serving=lr.summary(), rate=args.rate)
        state = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["rose"].state())
        samples = client.run_on_scheduler(_samples)
        asked = list(cluster.elastic_asked_at)
        # core 1's rollout worker: rose's serving worker, ideal's second dedicated one, elastic's on-demand one
        core1 = {a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                 if w["name"] == "serving-0" or w["name"] == "dedicated-1" or str(w["name"]).startswith("elastic-")}
    out.update(core1_use(samples, core1, stamps[0], stamps[-1]))
    out.update(core1_steps(engine_s[0], engine_s[-1], core1, stamps[-1] - stamps[0]))
    out["driver_cpu_share"] = (driver_cpu[-1] - driver_cpu[0]) / (stamps[-1] - stamps[0])
    if client_cpu:
        out["client_cpu_share"] = (client_cpu[-1] - client_cpu[0]) / (stamps[-1] - stamps[0])
    if cluster_cfg.policy == "elastic":
        first: dict[str, float] = {}
        for t, addr, _, _, used in samples:
            if used > 0:
                first.setdefault(addr, t)
        # on-demand workers: every sampled worker but the ones there from the start (an on-demand one
        # given back after its idle grace is no longer in the state)
        initial = {a for a, w in state["workers"].items() if not w["elastic"]}
        used = sorted(t for a, t in first.items() if a not in initial)
        waited = waited_for_capacity(asked, used, stamps[0], stamps[-1])
        out.update(allocation_overhead=waited / (stamps[-1] - stamps[0]),
                   elastic_asked_s=[round(a - stamps[0], 1) for a in asked],  # from the timed window's start
                   elastic_first_rollout_s=[round(u - stamps[0], 1) for u in used])
    m = report.metrics
    timed = m[m["step"] >= 1]
    out.update(traj_s=float(timed["trajectories"].sum()) / (stamps[-1] - stamps[0]), window_s=stamps[-1] - stamps[0],
               rollout_s=float(timed["rollout_s"].mean()), train_s=float(timed["train_s"].mean()),
               sync_s=float(timed["sync_s"].mean()), step_s=float(timed["step_s"].mean()),
               trainer_compute_s=float(timed["trainer_compute_s"].mean()), lost=report.lost,
               duplicated=report.duplicated,
               failed=int(m["failed"].sum()), reward_last=float(m["reward_mean"].iloc[-5:].mean()),
               placement=report.trajectories["placement"].value_counts().to_pylist(),
               workers={a: {k: w[k] for k in ("role", "slots", "dispatched", "shed", "migrated", "yielded", "elastic",
                                              "colocated")}
                        for a, w in state["workers"].items() if w["role"] != "trainer"},
               plugin_errors=state["errors"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="12 steps; fixed sync, rose async and ideal async only, mirrored (under 5 minutes)")
    ap.add_argument("--steps", type=int, default=None, help="steps of every run but elastic's (default 30; quick 12)")
    ap.add_argument("--elastic-steps", type=int, default=90,
                    help="steps of elastic's runs: long enough that its allocation wait is a stated fraction")
    ap.add_argument("--dedicated-slots", type=int, default=64,
                    help="rollout sequences the core-0 dedicated worker runs at once under elastic, rose and ideal")
    ap.add_argument("--allocation-delay", type=float, default=15.0, help="elastic: seconds to get a worker")
    ap.add_argument("--rate", type=float, default=None,
                    help="serving requests per second, fixed for every rose run (default: 15%% of --capacity)")
    ap.add_argument("--capacity", type=float, default=None,
                    help="the serving worker's capacity (req/s; default: measured at the first rose run's start): "
                         "serving_load = rate / capacity")
    ap.add_argument("--ttft-ms", type=float, default=300.0)
    ap.add_argument("--tpot-ms", type=float, default=30.0)
    ap.add_argument("--trace", default=os.path.join(ROOT, "benchmarks", "data", "azure_llm_inference_2023_conv.csv"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serving-seqs", type=int, default=128,
                    help="rollout sequences the serving worker may hold (rose), and core 1's dedicated worker's "
                         "slots (ideal, elastic's on-demand worker)")
    ap.add_argument("--migrate", action="store_true",
                    help="rose moves its tail off the serving worker to dedicated room (ClusterConfig.migrate)")
    ap.add_argument("--policies", default="fixed,elastic,rose,ideal", help=argparse.SUPPRESS)  # debugging: a subset
    ap.add_argument("--driver-anywhere", action="store_true",
                    help="leave this process (the driver, the scheduler, the nannies) free to run on core 1 too")
    args = ap.parse_args()
    steps = args.steps or (12 if args.quick else 30)
    if args.capacity is not None and args.rate is None:
        args.rate = round(LOAD * args.capacity, 1)

    import rose
    from rose.config import ElasticConfig
    from rose.envs import env_class
    from rose.models import prepare_model
    from rose.pipeline import load_pipeline

    pipeline = replace(load_pipeline(os.path.join(ROOT, "pipelines", "guess.py")), seed=args.seed)
    model_dir = prepare_model(pipeline.model, env_class(pipeline.env), progress=False)
    base = rose.ClusterConfig(num_dedicated=1, cores=(0, 1), trainer_cores=(0,), serving_ttft_ms=args.ttft_ms,
                              serving_tpot_ms=args.tpot_ms)
    if not args.driver_anywhere:  # the job's control plane on the job's core (the docstring)
        bind_to_cores(base.trainer_cores)
    elastic = ElasticConfig(max_extra=1, worker_slots=args.serving_seqs, allocation_delay_s=args.allocation_delay,
                            idle_release_s=60.0)
    fixed = replace(base, policy="fixed")
    rose_cfg = replace(base, policy="rose", dedicated_slots=args.dedicated_slots, num_serving=1,
                       serving_model=model_dir, serving_rollout_seqs=args.serving_seqs, migrate=args.migrate)
    # ideal: rose's layout with core 1's serving worker replaced by a dedicated one of its slots
    ideal = replace(base, policy="fixed", num_dedicated=2, dedicated_slots=args.dedicated_slots)
    # label -> (policy, cluster, staleness, core 1's dedicated slots, steps). Fixed runs in the modes that
    # could be its best: synchronous, and asynchronous with its trainer and dedicated worker sharing core 0
    # (the OS interleaves them). Asynchronous with the dedicated worker yielding to the trainer is
    # synchronous with extra steps for fixed (no other rollout capacity), so it is not run.
    modes = {"fixed sync": ("fixed", fixed, 0, None, steps),
             "fixed async": ("fixed", replace(fixed, yield_to_trainer=False), 1, None, steps),
             "rose sync": ("rose", rose_cfg, 0, None, steps),
             "rose async": ("rose", rose_cfg, 1, None, steps),
             "ideal sync": ("ideal", ideal, 0, args.serving_seqs, steps),
             "ideal async": ("ideal", ideal, 1, args.serving_seqs, steps),
             "elastic async": ("elastic", replace(base, policy="elastic", dedicated_slots=args.dedicated_slots,
                                                  elastic=elastic), 1, args.serving_seqs, args.elastic_steps)}
    # Every run twice, in mirrored order (A B ... B A): the host's drift (tens of percent over minutes
    # on this shared VM) cancels in each mode's mean if it is steady.
    half = (["fixed sync", "rose async", "ideal async"] if args.quick else
            ["fixed sync", "rose async", "ideal async", "fixed async", "rose sync", "ideal sync", "elastic async"])
    order = [k for k in half + half[::-1] if modes[k][0] in args.policies.split(",")]
    rate = f"{args.rate:.1f} req/s" if args.rate else f"{LOAD:.0%} of its capacity, measured at the first rose run"
    print(f"serving: {rate}, the same in every rose run; SLO TTFT {args.ttft_ms:.0f} ms / TPOT "
          f"{args.tpot_ms:.0f} ms; run order: {', '.join(order)}", file=sys.stderr, flush=True)
    results: dict[str, list[dict]] = {}
    for label in order:
        name, cfg, staleness, spare, n = modes[label]
        print(f"running {label} ({n} steps)...", file=sys.stderr, flush=True)
        r = run_policy(name, pipeline, cfg, n, args, staleness, spare)
        results.setdefault(label, []).append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)

    def mean(label: str, key: str) -> float:
        return sum(r[key] for r in results[label]) / len(results[label])

    def best(policy: str) -> str | None:
        return max((k for k, rs in results.items() if rs[0]["policy"] == policy), key=lambda k: mean(k, "traj_s"),
                   default=None)

    load = args.rate / args.capacity if args.rate and args.capacity else 0.0  # 0: no rose run
    keys = {p: best(p) for p in ("fixed", "elastic", "rose", "ideal")}
    fk, ek, rk, ik = keys["fixed"], keys["elastic"], keys["rose"], keys["ideal"]
    traj = {p: mean(k, "traj_s") if k else None for p, k in keys.items()}
    f_traj = traj["fixed"]
    frac = ((traj["rose"] - f_traj) / ((traj["ideal"] - f_traj) * (1 - load))
            if f_traj and traj["rose"] and traj["ideal"] and traj["ideal"] > f_traj else None)
    print(f"\nelastic_e2e: pipelines/guess.py, {steps} steps (timed: 1..{steps - 1}; elastic {args.elastic_steps}), "
          f"128 trajectories a step; core-0 dedicated slots {args.dedicated_slots} (elastic, rose, ideal); core 1: "
          f"{args.serving_seqs} rollout sequences (rose's serving worker, ideal's and elastic's dedicated one); "
          f"allocation delay {args.allocation_delay:.0f} s; serving {args.rate or 0:.1f} req/s ({load:.0%} of "
          f"{args.capacity or 0:.0f} req/s capacity, "
          f"Azure conversation trace), SLO TTFT {args.ttft_ms:.0f} ms / TPOT {args.tpot_ms:.0f} ms; in run order; "
          f"speed-ups against the mean of the best fixed mode ({fk})")
    print(f"{'run':<15}{'traj/s':>8}{'speedup':>9}{'step s':>8}{'rollout s':>10}{'train s':>9}{'compute s':>10}"
          f"{'sync s':>8}{'core1 slots/used':>17}{'core1 roll/serve':>17}{'SLO timed/run':>14}{'TTFT/TPOT p99':>15}"
          f"{'alloc':>7}{'lost':>6}{'dup':>5}"
          "  rollout placement")
    seen: dict[str, int] = {}
    for label in order:
        r = results[label][seen.get(label, 0)]
        seen[label] = seen.get(label, 0) + 1
        slo = f"{r['slo_attainment']:.4f}/{r['slo_attainment_run']:.3f}" if "slo_attainment" in r else "-"
        p99 = f"{r['serving']['ttft_p99_ms']:.0f}/{r['serving']['tpot_p99_ms']:.0f}" if "serving" in r else "-"
        alloc = f"{r['allocation_overhead']:.2f}" if "allocation_overhead" in r else "-"
        placed = ", ".join(f"{p['counts']} {p['values']}" for p in r["placement"])
        speedup = f"{r['traj_s'] / f_traj:.2f}" if f_traj else "-"
        print(f"{label:<15}{r['traj_s']:>8.1f}{speedup:>9}{r['step_s']:>8.3f}"
              f"{r['rollout_s']:>10.3f}{r['train_s']:>9.3f}{r['trainer_compute_s']:>10.3f}{r['sync_s']:>8.3f}"
              f"{r['core1_slots']:>11.0f}/{r['core1_used']:<5.0f}"
              f"{r['core1_rollout_share']:>11.0%}/{r['core1_serving_share']:<5.0%}{slo:>14}{p99:>15}{alloc:>7}"
              f"{r['lost']:>6}"
              f"{r['duplicated']:>5}  {placed}")
    print("means: " + ", ".join(f"{k} {mean(k, 'traj_s'):.1f} traj/s"
                                + (f" ({mean(k, 'traj_s') / f_traj:.2f})" if f_traj else "") for k in results))
    everything = [r for rs in results.values() for r in rs]
    slos = [r["slo_attainment"] for r in everything if "slo_attainment" in r]

    def rounded(x, nd):
        return None if x is None else round(x, nd)

    print(json.dumps({
        "bench": "elastic_e2e", "fixed_traj_s": rounded(f_traj, 2), "elastic_traj_s": rounded(traj["elastic"], 2),
        "rose_traj_s": rounded(traj["rose"], 2), "ideal_traj_s": rounded(traj["ideal"], 2),
        "speedup_vs_fixed": rounded(f_traj and traj["rose"] and traj["rose"] / f_traj, 3),
        "ideal_speedup_vs_fixed": rounded(f_traj and traj["ideal"] and traj["ideal"] / f_traj, 3),
        "fraction_of_ideal": rounded(frac, 3),
        "allocation_overhead_elastic": rounded(ek and mean(ek, "allocation_overhead"), 3),
        "rollout_time_fixed_s": rounded(fk and mean(fk, "rollout_s"), 3),
        "rollout_time_elastic_s": rounded(ek and mean(ek, "rollout_s"), 3),
        "rollout_time_rose_s": rounded(rk and mean(rk, "rollout_s"), 3),
        "rollout_time_ideal_s": rounded(ik and mean(ik, "rollout_s"), 3),
        "train_time_rose_s": rounded(rk and mean(rk, "train_s"), 3),
        "train_time_ideal_s": rounded(ik and mean(ik, "train_s"), 3),
        # shares of the timed window core 1's worker spent in rollout and in serving engine steps
        "core1_rollout_share_rose": rounded(rk and mean(rk, "core1_rollout_share"), 3),
        "core1_serving_share_rose": rounded(rk and mean(rk, "core1_serving_share"), 3),
        "core1_rollout_share_ideal": rounded(ik and mean(ik, "core1_rollout_share"), 3),
        # core 1's CPU over the timed window: its worker's process (every thread) and, in rose's runs, the
        # serving traffic's client process, which runs there too
        "core1_cpu_share_rose": rounded(rk and mean(rk, "core1_cpu_share"), 3),
        "client_cpu_share_rose": rounded(rk and mean(rk, "client_cpu_share"), 3),
        "core1_cpu_share_ideal": rounded(ik and mean(ik, "core1_cpu_share"), 3),
        "slo_attainment": rounded(rk and min(r["slo_attainment"] for r in results[rk]), 4),
        "lost": sum(r["lost"] for r in everything), "duplicated": sum(r["duplicated"] for r in everything),
        "steps": steps, "elastic_steps": args.elastic_steps if ek else None, "serving_rate": args.rate,
        "serving_capacity": rounded(args.capacity, 1), "serving_load": round(load, 3), "ttft_ms": args.ttft_ms,
        "tpot_ms": args.tpot_ms, "migrate": args.migrate, "quick": args.quick,
        "driver_anywhere": args.driver_anywhere,
        "fixed_run": fk, "elastic_run": ek, "rose_run": rk, "ideal_run": ik,
        "speedup_per_run": {f"{k} #{i + 1}": round(r["traj_s"] / f_traj, 3)
                            for k, rs in results.items() for i, r in enumerate(rs)} if f_traj else None,
        "min_slo_attainment": round(min(slos), 4) if slos else None,
        # the same over each whole run: with the job's start, when the serving worker builds its rollout engine
        "min_slo_attainment_run": round(min(r["slo_attainment_run"] for r in everything if "slo_attainment_run" in r),
                                        4) if slos else None}))


if __name__ == "__main__":
    main()
