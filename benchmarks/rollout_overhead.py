"""Claim: ROSE's rollout path costs little over calling vLLM directly (target: ratio >= 0.8).

Same episodes (guess env, same seeds, same per-turn sampling seeds, temperature 1) two ways, in one run:
- rose:   the step graph's rollout tasks (one per GRPO group) placed by rose.plugin on a LocalRoseCluster
          dedicated worker with its default slots (agent loops on the engine loop thread's event loop,
          Arrow record batches back to the driver);
- direct: vLLM's `LLM.generate` in this process, all live episodes batched per turn, envs stepped here.
Both engines are bound to the same single core and built from the same engine arguments
(`engine_kwargs`), both processes collect garbage as a ROSE worker does (`tune_gc`), and both stay up
for the whole run; rounds alternate between the two paths.
Throughput is generated tokens per wall second over the timed rounds after one warm-up round (24 of 256
episodes by default: a round lasts about 0.4 s, and on a shared host a few slow rounds moved an 8-round
figure by up to 0.08: 8-round runs of one code gave 0.761 and 0.840 minutes apart, its rounds 0.59-0.89;
24-round runs 0.834-0.839; RESULTS.md, 2026-12-06). Each
synchronous round's time is also split into the engine's own (its iterations: `LLMEngine.step` timed
in the direct process, the engine loop's `busy_s` on ROSE's worker, read off the clock) and the rest,
the path around the engine: where the two paths' times differ.
`ratio` is for synchronous rounds (each round's rollouts submitted, run and gathered before the next).
That is a step's rollout phase in both of the runner's modes: an asynchronous step (`staleness=1`,
rose/schedule.py) also starts its rollouts once the step before has its rollouts done, and only its
training overlaps them (no trainer runs here). `ratio_async` is for the same rounds overlapped: the next
one submitted while the current one runs (a caller that keeps a round queued), in blocks that alternate,
mirrored, with the direct baseline running the same rounds. ROSE's clock stops when a round's
trajectories are gathered at the driver (the runner gathers them later, off the rollout phase).

    python benchmarks/rollout_overhead.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.support.child import LineChild  # noqa: E402

CORE = 0  # both paths' engines run on this core


def episodes(step: int, n: int, seed: int):
    from rose.graph import Graph, LowerContext, lower

    g = Graph("bench")
    g.add("prompts", "prompts", env="guess", num_groups=n // 8, group_size=8)
    low = lower(g, LowerContext(step=step, weight_version=0, graph="bench", seed=seed))
    return low.outputs[("prompts", "specs")]


def serve_direct(model_dir, engine_cfg, max_len, n, seed):
    """Baseline process: build the engine, then run one round per line `ROUND r` read from stdin,
    answering each with a JSON line [tokens, seconds]."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from rose.envs import make_env
    from rose.models.tokens import decode, encode
    from rose.runtime.engine.vllm_engine import engine_kwargs

    llm = LLM(**engine_kwargs(model_dir, engine_cfg, max_len, seed))  # ROSE's engine, argument for argument
    tok = AutoTokenizer.from_pretrained(model_dir)
    stops = [tok.convert_tokens_to_ids("\n"), tok.eos_token_id]
    # The engine's own time (its iterations), apart from the round's: what is left is the path around it.
    engine, step, engine_s = llm.llm_engine, llm.llm_engine.step, [0.0]

    def timed_step(*a, **kw):
        t = time.perf_counter()
        try:
            return step(*a, **kw)
        finally:
            engine_s[0] += time.perf_counter() - t

    engine.step = timed_step
    print("READY", flush=True)
    for line in sys.stdin:
        r = int(line.split()[1])
        specs = episodes(r, n, seed)
        envs = [make_env(s.env) for s in specs]
        ctx = [[tok.bos_token_id] + encode(tok, e.reset(s.env_seed))
               for e, s in zip(envs, specs)]
        alive = list(range(len(specs)))
        gen_tokens, engine_s[0] = 0, 0.0
        t0 = time.perf_counter()
        for turn in range(max(e.max_turns for e in envs)):
            if not alive:
                break
            params = [SamplingParams(max_tokens=envs[i].max_action_tokens, temperature=specs[i].temperature,
                                     stop_token_ids=stops, seed=specs[i].turn_seed(turn), logprobs=0,
                                     detokenize=False, skip_clone=True) for i in alive]
            outs = llm.generate([{"prompt_token_ids": ctx[i]} for i in alive], params, use_tqdm=False)
            still = []
            for i, o in zip(alive, outs):
                ids = list(o.outputs[0].token_ids)
                gen_tokens += len(ids)
                res = envs[i].step(decode(tok, ids))
                ctx[i] += ids + encode(tok, res.observation)
                if not res.done and turn + 1 < envs[i].max_turns:
                    still.append(i)
            alive = still
        print(json.dumps([gen_tokens, time.perf_counter() - t0, engine_s[0]]), flush=True)


def direct_baseline(n, seed) -> LineChild:
    """The baseline's process, driven round by round from here (`ask(f"ROUND {r}")`)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--direct-only", "--trajectories", str(n), "--seed", str(seed)]
    return LineChild(cmd, "the direct baseline")


def run_both(model_dir, engine_cfg, max_len, rounds, n, seed):
    """Alternate rounds: direct round r, then ROSE round r (the same episodes), so that both paths see
    the same machine: on a shared host, throughput drifts by tens of percent from minute to minute.
    ROSE's round is its own path: a step graph (prompts -> rollout) lowered and submitted as the
    runner does. Then the same rounds once more through ROSE overlapped, in blocks (half the
    rounds each; all of them below 4): each round's graph is submitted while the one before still runs
    (at most two in flight); the direct baseline runs the same blocks,
    mirrored (direct, rose, rose, direct). Returns ([(direct_tokens, direct_s, direct_engine_s, rose_tokens,
    rose_s, rose_engine_s)] per timed round, where *_engine_s is the time inside the engine's iterations,
    and (direct_tokens, direct_s, rose_tokens, rose_s) of the asynchronous phase)."""
    from distributed import Client, wait

    from rose.config import ClusterConfig
    from rose.fleet import roles_of as _roles
    from rose.graph import Graph, LowerContext, lower
    from rose.graph.submit import submit
    from rose.runtime.cluster import LocalRoseCluster
    from rose.runtime.trajectory import concat
    from rose.runtime.protocol import ModelSpec
    from rose.runtime.worker.plugin import prepare_worker

    ncores = len(os.sched_getaffinity(0))
    cores = (CORE, (CORE + 1) % ncores) if ncores > 1 else (CORE,)
    direct = direct_baseline(n, seed)
    try:
        with LocalRoseCluster(ClusterConfig(num_dedicated=1, cores=cores), engine_cfg) as cluster, \
                Client(cluster) as client:
            roles = _roles(client)
            roles["rollout"] = roles["dedicated"]
            spec = ModelSpec(model_dir, max_len, engine_cfg, seed)
            client.submit(prepare_worker, spec, workers=roles["dedicated"], pure=False).result()
            def start(r):
                g = Graph("bench")
                specs = g.add("prompts", "prompts", env="guess", num_groups=n // 8, group_size=8)
                g.add("rollout", "rollout", inputs={"specs": specs.out("specs")})
                low = lower(g, LowerContext(step=r, weight_version=0, graph="bench", seed=seed))
                futures = submit(client, low.tasks, roles)
                return [futures[k] for k in low.keys_of("rollout", "trajectories")]

            def finish(r, outs):
                """The round's trajectories, back at the driver (as the runner gathers them)."""
                wait(outs)
                table = concat(client.gather(outs))
                if table.num_rows != n:
                    raise RuntimeError(f"round {r}: {table.num_rows} trajectories back, expected {n}")
                return table

            def tokens(table) -> int:  # counted after the clock stops (the direct path counts as it goes)
                return sum(sum(m) for m in table["loss_mask"].to_pylist())

            def engine_busy_s() -> float:  # the worker's engine's time in its iterations so far (read off the clock)
                def busy(dask_worker):
                    return dask_worker.plugins["rose"].host.engine.counters()["busy_s"]
                return next(iter(client.run(busy, workers=roles["dedicated"]).values()))

            results = []
            for r in tqdm(range(rounds + 1), desc="rounds (direct, rose)"):  # round 0 warms both up
                d_tokens, d_s, d_engine_s = direct.ask(f"ROUND {r}")
                busy0 = engine_busy_s()
                t0 = time.perf_counter()
                table = finish(r, start(r))
                r_s = time.perf_counter() - t0
                if r > 0:
                    results.append((d_tokens, d_s, d_engine_s, tokens(table), r_s, engine_busy_s() - busy0))
            # Overlapped: blocks of rounds, in each round r+1 submitted before round r is waited for;
            # a block's clock runs from its first submission to its last round's gather. The direct
            # baseline runs the same rounds (in lockstep, as it runs any round), block for block, in
            # mirrored order (direct, rose, rose, direct), so both sides do the same work in the same minutes.
            block = rounds if rounds < 4 else rounds // 2
            a_tokens = a_s = 0.0
            direct_async = []

            def rose_block(rs):
                nonlocal a_tokens, a_s
                t0 = time.perf_counter()
                inflight, tables = [(rs[0], start(rs[0]))], []
                for r in rs[1:] + [None]:
                    if r is not None:
                        inflight.append((r, start(r)))
                    tables.append(finish(*inflight.pop(0)))
                a_s += time.perf_counter() - t0
                a_tokens += sum(tokens(t) for t in tables)

            blocks = [list(range(first, min(rounds, first + block - 1) + 1)) for first in range(1, rounds + 1, block)]
            for i, rs in enumerate(blocks):
                sides = [lambda: direct_async.extend(direct.ask(f"ROUND {r}") for r in rs), lambda: rose_block(rs)]
                for side in (sides if i % 2 == 0 else reversed(sides)):
                    side()
    finally:
        direct.close()
    d_tokens, d_s = sum(d[0] for d in direct_async), sum(d[1] for d in direct_async)
    return results, (d_tokens, d_s, a_tokens, a_s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer, smaller rounds (about 2 minutes)")
    ap.add_argument("--trajectories", type=int, default=None, help="episodes per round (multiple of 8)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds [default: 24; --quick: 3]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-hold-ms", type=float, default=None,
                    help="EngineConfig.batch_hold_ms of ROSE's engine [default: EngineConfig's]")
    ap.add_argument("--direct-only", action="store_true", help=argparse.SUPPRESS)  # internal: the baseline's process
    args = ap.parse_args()
    n = args.trajectories or (64 if args.quick else 256)
    rounds = args.rounds or (3 if args.quick else 24)

    from rose.config import EngineConfig, ModelConfig
    from rose.envs import env_class
    from rose.models import prepare_model
    from rose.runtime.engine.vllm_engine import configure_vllm_env

    model_cfg = ModelConfig()
    engine_cfg = EngineConfig() if args.batch_hold_ms is None else EngineConfig(batch_hold_ms=args.batch_hold_ms)
    model_dir = prepare_model(model_cfg, env_class("guess"), seed=args.seed)
    if args.direct_only:
        from rose.runtime.worker.process import tune_gc

        tune_gc()  # as a ROSE worker does
        configure_vllm_env(engine_cfg, [CORE])
        os.sched_setaffinity(0, {CORE})
        serve_direct(model_dir, engine_cfg, model_cfg.max_model_len, n, args.seed)
        return
    # The baseline runs in its own process, so neither path inherits the other's engine, threads or
    # environment (vLLM edits LD_PRELOAD at import, which worker processes would inherit).
    results, (ad_tokens, ad_s, a_tokens, a_s) = run_both(model_dir, engine_cfg, model_cfg.max_model_len, rounds, n,
                                                         args.seed)
    print(f"\nrollout overhead: {n} guess episodes per round, engine on core {CORE}, rounds alternate")
    # engine s: inside the engine's iterations; outside: the rest of the round (the path around the engine)
    print(f"{'round':<7}{'direct tok':>11}{'direct s':>10}{'engine s':>10}{'rose tok':>10}{'rose s':>8}"
          f"{'engine s':>10}{'ratio':>7}")
    for r, (dt, ds, de, rt, rs, re) in enumerate(results, 1):
        print(f"{r:<7}{dt:>11}{ds:>10.2f}{de:>10.2f}{rt:>10}{rs:>8.2f}{re:>10.2f}{(rt / rs) / (dt / ds):>7.3f}")
    direct_tok_s = sum(x[0] for x in results) / sum(x[1] for x in results)
    rose_tok_s = sum(x[3] for x in results) / sum(x[4] for x in results)
    k = len(results)
    engine = {"direct_engine_s": sum(x[2] for x in results) / k, "rose_engine_s": sum(x[5] for x in results) / k,
              "direct_outside_s": sum(x[1] - x[2] for x in results) / k,
              "rose_outside_s": sum(x[4] - x[5] for x in results) / k}
    print(f"a round on average: direct {engine['direct_engine_s']:.3f} s in the engine + "
          f"{engine['direct_outside_s']:.3f} s outside it; rose {engine['rose_engine_s']:.3f} + "
          f"{engine['rose_outside_s']:.3f} s")
    ratio = rose_tok_s / direct_tok_s
    print(f"{'all':<7}{direct_tok_s:>11.1f} tok/s{'':>4}{rose_tok_s:>10.1f} tok/s   ratio rose/direct = {ratio:.3f} "
          f"(target >= 0.8)")
    async_ratio = (a_tokens / a_s) / (ad_tokens / ad_s)
    print(f"{'async':<7}{ad_tokens / ad_s:>11.1f} tok/s{'':>4}{a_tokens / a_s:>10.1f} tok/s   ratio rose/direct = "
          f"{async_ratio:.3f} (rounds 1..{rounds} overlapped in blocks, two in flight; direct: the same rounds, "
          f"block for block, mirrored)\n")
    print(json.dumps({"bench": "rollout_overhead", "rose_tok_s": round(rose_tok_s, 1),
                      "direct_tok_s": round(direct_tok_s, 1), "ratio": round(ratio, 3),
                      "rose_async_tok_s": round(a_tokens / a_s, 1), "ratio_async": round(async_ratio, 3),
                      **{f"{k}_per_round": round(v, 3) for k, v in engine.items()},
                      "trajectories": n, "rounds": rounds, "quick": args.quick}))


if __name__ == "__main__":
    main()
