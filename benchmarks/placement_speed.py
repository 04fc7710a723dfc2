"""Claim: the placement policy decides fast enough for a large cluster (target < 50 us a decision with
1,000 workers and 10,000 waiting tasks), measured against a direct scan of every worker per task (the
obvious implementation) in the same run.

The cluster: 20 % dedicated workers, 80 % serving workers with spare capacity between 0 and 64
sequences; 10 % of the workers one weight version behind. The tasks: GRPO groups of 8 from four
pipeline steps, a tenth of them continuations with a cache affinity. Capacity covers about half of
the tasks, so the policy must also decide quickly that the rest wait. Each policy runs on the same
snapshot; their assignments are checked to respect slots and versions.

    python benchmarks/placement_speed.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rose.runtime.placement import Assignment, RolloutTask, WorkerSlot, fair_order, place  # noqa: E402


def snapshot(num_workers: int, num_tasks: int, seed: int = 0):
    rng = random.Random(seed)
    workers = []
    for i in range(num_workers):
        dedicated = i < num_workers // 5
        workers.append(WorkerSlot(f"tcp://10.0.{i // 250}.{i % 250}:40000", "dedicated" if dedicated else "serving",
                                  slots=128 if dedicated else rng.randint(0, 64), used=rng.randint(0, 16),
                                  weight_version=4 if rng.random() < 0.1 else 5))
    # Slots scaled so capacity covers about half of the tasks' sequences.
    cap = sum(max(0, w.free) for w in workers)
    scale = (num_tasks * 8 / 2) / max(cap, 1)
    workers = [WorkerSlot(w.address, w.role, int(w.slots * scale), int(w.used * scale), w.weight_version)
               for w in workers]
    tasks = [RolloutTask(f"rose-rollout-s{i % 4}-g{i}", 8, 5, f"guess/{i % 4}",
                         affinity=rng.choice(workers).address if rng.random() < 0.1 else None)
             for i in range(num_tasks)]
    return tasks, workers


def scan(tasks, workers, policy="rose"):
    """Baseline: for each task, look at every worker and take the best that fits."""
    free = {w.address: w.free for w in workers}
    rank = {"dedicated": 0, "serving": 1}
    out = []
    for t in fair_order(tasks):
        if t.affinity and free.get(t.affinity, 0) >= t.width:
            w = next(w for w in workers if w.address == t.affinity)
            if w.weight_version >= t.min_version:
                free[w.address] -= t.width
                out.append(Assignment(t.key, w.address, "affinity"))
                continue
        best = None
        for w in workers:
            if w.weight_version >= t.min_version and free[w.address] >= t.width:
                k = (rank[w.role], -free[w.address], w.address)
                if best is None or k < best[0]:
                    best = (k, w)
        if best is not None:
            free[best[1].address] -= t.width
            out.append(Assignment(t.key, best[1].address, best[1].role))
    return out


def check(out, tasks, workers):
    by_key = {t.key: t for t in tasks}
    load = {}
    by_addr = {w.address: w for w in workers}
    for a in out:
        assert by_addr[a.worker].weight_version >= by_key[a.key].min_version
        load[a.worker] = load.get(a.worker, 0) + by_key[a.key].width
    assert all(by_addr[a].used + n <= by_addr[a].slots for a, n in load.items())


def timed(fn, tasks, workers, repeats):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(tasks, workers)
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (same sizes)")
    args = ap.parse_args()
    tasks, workers = snapshot(args.workers, args.tasks)
    repeats = 3 if args.quick else 7
    t_rose, out = timed(place, tasks, workers, repeats)
    check(out, tasks, workers)
    t_scan, out_scan = timed(scan, tasks, workers, 1)
    check(out_scan, tasks, workers)
    us = t_rose / len(tasks) * 1e6
    us_scan = t_scan / len(tasks) * 1e6
    print(f"{'policy':<10} {'workers':>8} {'tasks':>7} {'placed':>7} {'total ms':>10} {'us/decision':>12}")
    print(f"{'place':<10} {len(workers):>8} {len(tasks):>7} {len(out):>7} {t_rose * 1e3:>10.1f} {us:>12.2f}")
    print(f"{'scan':<10} {len(workers):>8} {len(tasks):>7} {len(out_scan):>7} {t_scan * 1e3:>10.1f} {us_scan:>12.2f}")
    print(f"speedup over the scan: {us_scan / us:.1f}x (target: < 50 us a decision)")
    print(json.dumps({"bench": "placement_speed", "workers": len(workers), "tasks": len(tasks),
                      "us_per_decision": round(us, 2), "us_per_decision_scan": round(us_scan, 2),
                      "speedup_vs_scan": round(us_scan / us, 1), "placed": len(out)}))


if __name__ == "__main__":
    main()
