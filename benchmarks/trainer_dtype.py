"""Claim: `GRPOConfig(compute_dtype="auto")` (the default) gives the trainer the faster dtype for its
forward and backward passes on this host, and bf16 passes make the float32 passes' update to bf16
rounding (targets: auto's dtype steps at least as fast as the other one; the two trainers' first
updates, from the same weights on the same batch, point the same way: cosine >= 0.95).

Two trainers (rose.runtime.trainer.Trainer) of the default pipeline's tiny guess model, one with
float32 passes and one with bf16 autocast (float32 master weights either way), in one process bound to
one core with one torch thread, as the default pipeline's trainer worker is. Each GRPO step (the
pipeline's settings) trains on one batch of its size (16 groups of 8 conversations): the environment's
own valid play (`GuessEnv.demonstration`, the warm start's data), its policy tokens' behaviour
log-probs from the float32 model, rewards from the play. The two trainers step on the same batches,
alternating which goes first, so both see the same minutes of the host; throughput is policy-model
tokens (rows x their lengths, padding not counted) per second of `Trainer.step`, steps after the first.
`logprob_mismatch` is the first step's mean |trainer's log-prob - behaviour log-prob|, both at the same
weights: float32's rounding in float32, bf16's in bf16. Adam's first updates are nearly +-lr per
element whatever the gradient's size, so a weight whose tiny gradient bf16 rounds the other way moves
the other way: the largest element difference says little, the cosine of the whole updates more.

    python benchmarks/trainer_dtype.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CORE = 0  # one core and one torch thread, as the default pipeline's trainer worker has (core 1 of 2 there)
GROUPS, GROUP_SIZE = 16, 8  # pipelines/guess.py's batch


def batches(model_dir: str, n: int, seed: int) -> list:
    """`n` tables of GROUPS x GROUP_SIZE guess conversations (valid play), scored by the float32 model."""
    import pyarrow as pa
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rose.envs import env_class
    from rose.models.warmstart import encode_demo
    from rose.runtime.grpo import token_logprobs
    from rose.runtime.trajectory import Trajectory, to_batch

    env, rng = env_class("guess"), random.Random(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tables = []
    for step in range(n):
        trajs, rewards = [], []
        for g in range(GROUPS):
            for i in range(GROUP_SIZE):
                ids, mask = encode_demo(tok, env.demonstration(rng))
                with torch.no_grad():
                    lp = token_logprobs(model(input_ids=torch.tensor([ids])).logits, torch.tensor([ids]))[0].tolist()
                t = Trajectory(step, g, i, "guess", g, "{}")
                start = 0
                for end in range(1, len(ids) + 1):  # runs of environment and policy tokens, in order
                    if end == len(ids) or mask[end] != mask[start]:
                        if mask[start]:
                            t.add_generated(ids[start:end], lp[start:end], [0] * (end - start))
                        else:
                            t.add_context(ids[start:end])
                        start = end
                t.finish_reason = "done"
                trajs.append(t)
                rewards.append(float(rng.random() < 0.5))
        tables.append(pa.Table.from_batches([to_batch(trajs, rewards)]))
    return tables


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per trainer (default 16; quick 6)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    steps = args.steps or (6 if args.quick else 16)

    import torch

    from pipelines.guess import GRPO as pipeline  # the default pipeline's update, as it sets it
    from rose.config import GRPOConfig, ModelConfig
    from rose.envs import env_class
    from rose.models import prepare_model
    from rose.runtime.engine.dtype import choose_dtype, native_bf16
    from rose.runtime.trainer import Trainer

    if CORE in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {CORE})
    torch.set_num_threads(1)
    model_dir = prepare_model(ModelConfig(), env_class("guess"), seed=args.seed)
    tables = batches(model_dir, steps, args.seed)
    dtypes = ("float32", "bfloat16")
    trainers = {d: Trainer(model_dir, seed=args.seed) for d in dtypes}
    seconds = {d: 0.0 for d in dtypes}
    mismatch = {d: 0.0 for d in dtypes}
    tokens, cosine = 0, None

    def update(d: str) -> torch.Tensor:  # the whole model's change since `before`, one flat vector
        now = trainers[d].model.state_dict()
        return torch.cat([(now[n] - w).flatten() for n, w in before.items()])

    before = {n: w.clone() for n, w in trainers["float32"].model.state_dict().items()}
    for s, table in enumerate(tables):
        for d in (dtypes if s % 2 == 0 else dtypes[::-1]):
            t0 = time.perf_counter()
            m = trainers[d].step(table, GRPOConfig(**{**pipeline.__dict__, "compute_dtype": d}))
            if s > 0:  # the first step warms up (allocations, the optimizer's state)
                seconds[d] += time.perf_counter() - t0
            mismatch[d] = mismatch[d] if s else m["logprob_mismatch"]
        if s == 0:
            cosine = float(torch.nn.functional.cosine_similarity(update("float32"), update("bfloat16"), dim=0))
        else:
            tokens += sum(len(x) for x in table["token_ids"].to_pylist())
    native = native_bf16("cpu")
    auto = choose_dtype("auto", [native])
    other = dtypes[1 - dtypes.index(auto)]
    tok_s = {d: tokens / seconds[d] for d in dtypes}
    print(f"\ntrainer dtype: {steps} GRPO steps of {GROUPS * GROUP_SIZE} guess conversations each (4 inner epochs), "
          f"core {CORE}, one thread; auto picks {auto} (native bf16: {native})")
    print(f"{'dtype':<10}{'tok/s':>10}{'s/step':>9}{'logprob mismatch':>18}")
    for d in dtypes:
        print(f"{d:<10}{tok_s[d]:>10.0f}{seconds[d] / (steps - 1):>9.3f}{mismatch[d]:>18.2e}")
    ratio = tok_s[auto] / tok_s[other]
    print(f"auto ({auto}) / {other}: {ratio:.2f}x (target >= 1); cosine of the two first updates {cosine:.4f} "
          f"(target >= 0.95)\n")
    print(json.dumps({"bench": "trainer_dtype", "auto": auto, "native_bf16": native, "other": other,
                      "ratio": round(ratio, 3), "tok_s": {d: round(tok_s[d], 1) for d in dtypes},
                      "s_per_step": {d: round(seconds[d] / (steps - 1), 4) for d in dtypes},
                      "logprob_mismatch": {d: float(f"{mismatch[d]:.3g}") for d in dtypes},
                      "update_cosine": round(cosine, 4), "steps": steps, "quick": args.quick}))


if __name__ == "__main__":
    main()
