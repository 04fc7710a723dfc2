"""Claim: the trainer sharded over 2 ranks (FSDP2, rose/runtime/sharding.py) makes the same updates as
one trainer, while each rank holds well under the single trainer's memory; measured against 1 rank in
the same run, on the same batches.

Each configuration runs in fresh processes (torch.distributed over gloo on this CPU host, one process
per rank, the host's cores split evenly between them): the same model (the 101 M-parameter model of
weight_sync; --quick: a 25 M one), the same trajectory batches, three GRPO steps in float32. Reported:
the largest difference between the final weights of 1 and 2 ranks, each rank's peak resident memory
over its baseline (taken before the model is loaded; freed memory returned to the system at once,
see `run`) as a share of the single trainer's, and tokens trained per second.

After the last step every rank publishes its own shards of the weights (bf16, 1 MiB shards:
rose/runtime/weights/publisher.py, as the trainer workers do); `sync_exact` holds when the union of the
ranks' parts is the manifest one trainer would publish from the gathered weights, hash for hash, and
the bytes the ranks hold assemble into exactly those weights. Not measured: GPUs (nccl): none here.

    python benchmarks/trainer_scale.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STEPS = 3


def batches(seed: int, rows: int, steps: int):
    """`steps` trajectory tables of `rows` rows (groups of 4), 24-96 tokens each, rewards that vary."""
    import pyarrow as pa

    from rose.runtime.trajectory import Trajectory, to_batch

    rng = random.Random(seed)
    out = []
    for step in range(steps):
        trajs, rewards = [], []
        for r in range(rows):
            t = Trajectory(step, r // 4, r % 4, "guess", r // 4, "{}")
            t.add_context([1] + [rng.randrange(5, 200) for _ in range(rng.randrange(8, 24))])
            for _ in range(rng.randrange(1, 4)):
                n = rng.randrange(4, 24)
                t.add_generated([rng.randrange(5, 200) for _ in range(n)], [-rng.uniform(0.5, 4) for _ in range(n)],
                                [step] * n)
                t.add_context([rng.randrange(5, 200) for _ in range(rng.randrange(0, 8))])
            t.finish_reason = "done"
            trajs.append(t)
            rewards.append(rng.choice([0.0, 0.5, 1.0]))
        out.append(pa.Table.from_batches([to_batch(trajs, rewards)]))
    return out


def _rss_peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _rss_now_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def rank_main(rank: int, world: int, port: int, model_dir: str, rows: int, threads: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    os.sched_setaffinity(0, {rank % os.cpu_count()} if world > 1 else set(range(os.cpu_count())))
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from rose.config import GRPOConfig
    from rose.runtime.trainer import Trainer
    from rose.runtime.weights.publisher import RankPublisher, union
    from rose.runtime.weights.shards import assemble, shard_params

    # Imported before the baseline: transformers and the model's class (loading imports it), whose
    # import is not the model's memory.
    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(model_dir))]
    tables = batches(0, rows, STEPS)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    base = _rss_now_mb()
    trainer = Trainer(model_dir, device="cpu")
    cfg = GRPOConfig(lr=1e-5, inner_epochs=1, compute_dtype="float32")  # the 1e-5 target is float32's rounding
    t0, tokens = time.perf_counter(), 0
    for table in tables:
        trainer.step(table, cfg)
        tokens += sum(len(x) for x in table["token_ids"].to_pylist())
    seconds = time.perf_counter() - t0
    peak = _rss_peak_mb() - base
    t1 = time.perf_counter()
    own, data, _ = RankPublisher("bfloat16", 1 << 20).part(trainer.model.state_dict(), trainer.version, None)
    publish_s = time.perf_counter() - t1
    full = trainer.full_state_dict()
    gathered = [None] * world  # every rank's (peak, publish seconds, its shards, their bytes)
    dist.all_gather_object(gathered, (peak, publish_s, own, {h: bytes(b) for h, b in data.items()}))
    if rank == 0:
        torch.save({"weights": full}, out + ".weights")
        whole = union([g[2] for g in gathered])
        held = {h: b for g in gathered for h, b in g[3].items()}
        got = assemble(whole, held.__getitem__)
        exact = whole == shard_params(full, trainer.version, "bfloat16", 1 << 20)[0] and set(got) == set(full) \
            and all(torch.equal(got[k], v.to(torch.bfloat16)) for k, v in full.items())
        with open(out, "w") as f:
            json.dump({"peak_mb": [g[0] for g in gathered], "seconds": seconds, "tokens": tokens, "sync_exact": exact,
                       "publish_s": [round(g[1], 3) for g in gathered], "shards": [len(g[2].shards) for g in gathered]},
                      f)
    dist.destroy_process_group()


def run(world: int, model_dir: str, rows: int) -> dict:
    import torch
    import torch.multiprocessing as mp

    # Resident memory as the measure of what a rank holds: glibc keeps freed heap memory by default, so
    # a process's resident set stays at its high-water mark of everything ever allocated, not of what
    # is alive. Served from mmap above 64 KiB (every tensor that matters), a free returns its pages at
    # once: the peak is then the peak of live tensors. (Seen: 25 M model, 1 rank, steady state 852 MB
    # resident by default against the 416 MB its weights, gradients and AdamW state take.) The rank
    # processes read it at start; both configurations run with it, the same cost to each.
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(tempfile.mkdtemp(prefix="rose-trainer-scale-"), "result.json")
    threads = max(1, (os.cpu_count() or 1) // world)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, world, port, model_dir, rows, threads, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise SystemExit(f"{world} rank(s): a rank exited with {bad[0]}")
    with open(out) as f:
        result = json.load(f)
    result["weights"] = torch.load(out + ".weights")["weights"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 25 M-parameter model and smaller batches")
    args = ap.parse_args()
    from rose.config import ModelConfig
    from rose.envs import env_class
    from rose.models import prepare_model

    big = ModelConfig(hidden_size=512, num_layers=6, num_heads=8, warmstart_steps=0) if args.quick else \
        ModelConfig(hidden_size=1024, num_layers=6, num_heads=16, warmstart_steps=0)  # weight_sync's 101 M
    model_dir = prepare_model(big, env_class("guess"), progress=False)
    rows = 16 if args.quick else 32
    results = {w: run(w, model_dir, rows) for w in (1, 2)}
    one, two = results[1], results[2]
    diff = max(float((one["weights"][k] - two["weights"][k]).abs().max()) for k in one["weights"])
    ratio = max(two["peak_mb"]) / one["peak_mb"][0]
    print(f"{'ranks':>5} {'peak MB per rank':>18} {'tokens/s':>9} {'seconds':>8} {'shards published':>17} "
          f"{'publish s':>11} {'exact':>6}")
    for w, r in results.items():
        print(f"{w:>5} {' / '.join(f'{x:.0f}' for x in r['peak_mb']):>18} {r['tokens'] / r['seconds']:>9.0f} "
              f"{r['seconds']:>8.1f} {' / '.join(map(str, r['shards'])):>17} "
              f"{' / '.join(f'{x:.2f}' for x in r['publish_s']):>11} {str(r['sync_exact']):>6}")
    print(f"max |w1 - w2| after {STEPS} steps: {diff:.2e}; peak memory per rank / single: {ratio:.3f}")
    print(json.dumps({"bench": "trainer_scale", "ranks": [1, 2], "max_weight_diff": diff,
                      "peak_mem_per_rank_ratio": round(ratio, 3), "tok_s_1": round(one["tokens"] / one["seconds"], 1),
                      "tok_s_2": round(two["tokens"] / two["seconds"], 1),
                      "sync_exact": bool(one["sync_exact"] and two["sync_exact"]),
                      "publish_s_1": max(one["publish_s"]), "publish_s_2": max(two["publish_s"]),
                      "model_params_m": round(sum(v.numel() for v in one["weights"].values()) / 1e6, 1)}))


if __name__ == "__main__":
    main()
