"""Claim: ROSE's rollout path costs little over calling vLLM directly (target: ratio >= 0.8).

Same episodes (guess env, same seeds, same per-turn sampling seeds, temperature 1) two ways, in one run:
- rose:   one Dask task per trajectory on a LocalRoseCluster dedicated worker (agent loop, engine loop
          thread, Arrow record batches back to the driver);
- direct: vLLM's `LLM.generate` in this process, all live episodes batched per turn, envs stepped here.
Both engines are bound to the same single core, with the same engine settings. Throughput is generated
tokens per wall second over timed rounds after one warm-up round.

    python benchmarks/rollout_overhead.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CORE = 0  # both paths' engines run on this core


def episodes(step: int, n: int, seed: int):
    from rose.graph import Graph, LowerContext, lower

    g = Graph("bench")
    g.add("prompts", "prompts", env="guess", num_groups=n // 8, group_size=8)
    low = lower(g, LowerContext(step=step, weight_version=0, graph="bench", seed=seed))
    return low.outputs[("prompts", "specs")]


def run_direct(model_dir, engine_cfg, max_len, rounds, n, seed):
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from rose.ops.envs import make_env

    llm = LLM(model=model_dir, dtype=engine_cfg.dtype, enforce_eager=True, max_model_len=max_len,
              max_num_seqs=engine_cfg.max_num_seqs, seed=seed, enable_prefix_caching=True)
    tok = AutoTokenizer.from_pretrained(model_dir)
    stops = [tok.convert_tokens_to_ids("\n"), tok.eos_token_id]
    times, tokens = [], []
    for r in range(rounds + 1):  # round 0 warms up
        specs = episodes(r, n, seed)
        envs = [make_env(s.env) for s in specs]
        ctx = [[tok.bos_token_id] + tok(e.reset(s.env_seed), add_special_tokens=False)["input_ids"]
               for e, s in zip(envs, specs)]
        alive = list(range(len(specs)))
        gen_tokens = 0
        t0 = time.perf_counter()
        for turn in range(max(e.max_turns for e in envs)):
            if not alive:
                break
            params = [SamplingParams(max_tokens=envs[i].max_action_tokens, temperature=specs[i].temperature,
                                     stop_token_ids=stops, seed=specs[i].turn_seed(turn), logprobs=0,
                                     detokenize=False) for i in alive]
            outs = llm.generate([{"prompt_token_ids": ctx[i]} for i in alive], params, use_tqdm=False)
            still = []
            for i, o in zip(alive, outs):
                ids = list(o.outputs[0].token_ids)
                gen_tokens += len(ids)
                res = envs[i].step(tok.decode(ids, skip_special_tokens=True))
                ctx[i] += ids + (tok(res.observation, add_special_tokens=False)["input_ids"] if res.observation else [])
                if not res.done and turn + 1 < envs[i].max_turns:
                    still.append(i)
            alive = still
        if r > 0:
            times.append(time.perf_counter() - t0)
            tokens.append(gen_tokens)
    del llm
    return sum(tokens) / sum(times), sum(tokens), sum(times)


def run_rose(model_dir, engine_cfg, max_len, rounds, n, seed):
    """ROSE's own path: a step graph (prompts -> rollout) lowered and submitted as the runner does."""
    from distributed import Client, wait

    from rose.config import ClusterConfig
    from rose.graph import Graph, LowerContext, lower
    from rose.graph.submit import submit
    from rose.runner import _roles
    from rose.runtime.cluster import LocalRoseCluster
    from rose.runtime.trajectory import concat
    from rose.worker import ModelSpec, prepare_worker

    ncores = len(os.sched_getaffinity(0))
    cores = (CORE, (CORE + 1) % ncores) if ncores > 1 else (CORE,)
    with LocalRoseCluster(ClusterConfig(num_dedicated=1, cores=cores), engine_cfg) as cluster, \
            Client(cluster) as client:
        roles = _roles(client)
        spec = ModelSpec(model_dir, max_len, engine_cfg, seed)
        client.submit(prepare_worker, spec, workers=roles["dedicated"], pure=False).result()
        times, tokens = [], []
        for r in range(rounds + 1):
            g = Graph("bench")
            specs = g.add("prompts", "prompts", env="guess", num_groups=n // 8, group_size=8)
            g.add("rollout", "rollout", inputs={"specs": specs.out("specs")})
            low = lower(g, LowerContext(step=r, weight_version=0, graph="bench", seed=seed))
            t0 = time.perf_counter()
            futures = submit(client, low.tasks, roles)
            outs = [futures[k] for k in low.keys_of("rollout", "trajectories")]
            wait(outs)
            table = concat(client.gather(outs))
            dt = time.perf_counter() - t0
            gen = sum(sum(m) for m in table["loss_mask"].to_pylist())
            assert table.num_rows == n
            if r > 0:
                times.append(dt)
                tokens.append(gen)
            del futures, outs
    return sum(tokens) / sum(times), sum(tokens), sum(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer, smaller rounds (about 2 minutes)")
    ap.add_argument("--trajectories", type=int, default=None, help="episodes per round (multiple of 8)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--direct-only", action="store_true", help=argparse.SUPPRESS)  # internal: the baseline's process
    args = ap.parse_args()
    n = args.trajectories or (64 if args.quick else 256)
    rounds = args.rounds or (2 if args.quick else 4)

    from rose.config import EngineConfig, ModelConfig
    from rose.models import prepare_model
    from rose.runtime.engine.vllm_engine import configure_vllm_env

    model_cfg = ModelConfig()
    engine_cfg = EngineConfig()
    model_dir = prepare_model(model_cfg, "guess", seed=args.seed)
    if args.direct_only:
        configure_vllm_env(engine_cfg, [CORE])
        os.sched_setaffinity(0, {CORE})
        print(json.dumps(run_direct(model_dir, engine_cfg, model_cfg.max_model_len, rounds, n, args.seed)))
        return
    # The baseline runs in its own process, so neither path inherits the other's engine, threads or
    # environment (vLLM edits LD_PRELOAD at import, which worker processes would inherit).
    cmd = [sys.executable, os.path.abspath(__file__), "--direct-only", "--trajectories", str(n), "--rounds",
           str(rounds), "--seed", str(args.seed)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    direct_tok_s, direct_tokens, direct_s = json.loads(out.strip().splitlines()[-1])
    rose_tok_s, rose_tokens, rose_s = run_rose(model_dir, engine_cfg, model_cfg.max_model_len, rounds, n, args.seed)
    ratio = rose_tok_s / direct_tok_s
    print(f"\nrollout overhead: {n} guess episodes x {rounds} timed rounds, engine on core {CORE}")
    print(f"{'path':<8}{'tokens':>10}{'seconds':>10}{'tok/s':>10}")
    print(f"{'direct':<8}{direct_tokens:>10}{direct_s:>10.2f}{direct_tok_s:>10.1f}")
    print(f"{'rose':<8}{rose_tokens:>10}{rose_s:>10.2f}{rose_tok_s:>10.1f}")
    print(f"ratio rose/direct = {ratio:.3f} (target >= 0.8)\n")
    print(json.dumps({"bench": "rollout_overhead", "rose_tok_s": round(rose_tok_s, 1),
                      "direct_tok_s": round(direct_tok_s, 1), "ratio": round(ratio, 3), "trajectories": n,
                      "rounds": rounds, "quick": args.quick}))


if __name__ == "__main__":
    main()
