"""Claim: the placement policy decides fast enough for a large cluster (target < 50 us a decision with
1,000 workers and 10,000 waiting tasks), measured against a direct scan of every worker per task (the
obvious implementation) in the same run.

The cluster: 20 % dedicated workers, 80 % serving workers with spare capacity between 0 and 64
sequences; 10 % of the workers one weight version behind. The tasks: GRPO groups of 8 from four
pipeline steps, a tenth of them continuations with a cache affinity. Capacity covers about half of
the tasks, so the policy must also decide quickly that the rest wait. Each policy runs on the same
snapshot, the same number of times, alternating; their assignments are checked to respect slots and
versions. Reported per decision (every waiting task) and per placed task.

    python benchmarks/placement_speed.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
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


def timed(policies: dict, tasks, workers, repeats: int) -> tuple[dict, dict]:
    """Median seconds of each policy over `repeats` runs, the policies alternating in mirrored order
    (a, b, b, a, ...) so that drift on the host falls on both alike; and each one's assignments."""
    names = list(policies)
    times: dict[str, list[float]] = {n: [] for n in names}
    outs = {}
    for r in range(repeats):
        for n in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            outs[n] = policies[n](tasks, workers)
            times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}, outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (same sizes)")
    args = ap.parse_args()
    tasks, workers = snapshot(args.workers, args.tasks)
    repeats = 3 if args.quick else 7  # each policy, the same number of times
    secs, outs = timed({"place": place, "scan": scan}, tasks, workers, repeats)
    for out in outs.values():
        check(out, tasks, workers)
    rows = {}
    print(f"{'policy':<8} {'workers':>8} {'tasks':>7} {'placed':>7} {'median ms':>10} {'us/decision':>12} "
          f"{'us/placed task':>15}")
    for name, t in secs.items():
        placed = len(outs[name])
        rows[name] = {"us_per_decision": t / len(tasks) * 1e6, "us_per_placed": t / max(placed, 1) * 1e6,
                      "placed": placed}
        print(f"{name:<8} {len(workers):>8} {len(tasks):>7} {placed:>7} {t * 1e3:>10.1f} "
              f"{rows[name]['us_per_decision']:>12.2f} {rows[name]['us_per_placed']:>15.2f}")
    rose, base = rows["place"], rows["scan"]
    speedup = base["us_per_decision"] / rose["us_per_decision"]
    print(f"\n{repeats} runs each, alternating; medians. Speed-up over the scan {speedup:.1f}x "
          f"(target: < 50 us a decision)")
    print(json.dumps({"bench": "placement_speed", "workers": len(workers), "tasks": len(tasks), "repeats": repeats,
                      "us_per_decision": round(rose["us_per_decision"], 2),
                      "us_per_placed_task": round(rose["us_per_placed"], 2),
                      "us_per_decision_scan": round(base["us_per_decision"], 2),
                      "us_per_placed_task_scan": round(base["us_per_placed"], 2),
                      "speedup_vs_scan": round(speedup, 1), "placed": rose["placed"], "placed_scan": base["placed"],
                      "quick": args.quick}))

if __name__ == "__main__":
    main()
