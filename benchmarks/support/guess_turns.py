"""How a `guess` run's policy plays, turn by turn, in blocks of steps: read off its trajectories.parquet.

    python benchmarks/support/guess_turns.py runs/guess [--block 20]

Per block: episodes found / missed / malformed; for each turn, the share of guesses *outside* the interval
the feedback so far leaves (a wasted turn: the teacher of the warm start never makes one) and the share
*at its midpoint* (either middle number: binary search's guess). Reward as the environment gave it.
"""
from __future__ import annotations

import argparse
import os

import pyarrow.parquet as pq

from rose.envs.guess import GuessEnv

_ENV = GuessEnv()  # the environment's defaults, which the pipeline uses
LOW, HIGH, TURNS = _ENV.low, _ENV.high, _ENV.max_turns


def block_stats(rows: list[dict]) -> dict:
    n = len(rows)
    out = {"episodes": n, "reward": sum(r["env_reward"] for r in rows) / n,
           "found": sum(r["env_reward"] > 0 for r in rows) / n,
           "missed": sum(r["env_reward"] == 0 for r in rows) / n,
           "malformed": sum(r["env_reward"] < 0 for r in rows) / n}
    guesses, outside, middle = [0] * TURNS, [0] * TURNS, [0] * TURNS
    for r in rows:
        lo, hi, target = LOW, HIGH, int(r["ground_truth"])
        for k, action in enumerate(r["actions"][:TURNS]):
            words = action.split()
            if len(words) != 2 or words[0] != "guess" or not words[1].isdigit():
                break  # malformed: the episode ended here
            g = int(words[1])
            guesses[k] += 1
            if not lo <= g <= hi:
                outside[k] += 1
            elif g in ((lo + hi) // 2, (lo + hi + 1) // 2):
                middle[k] += 1
            if g == target:
                break
            lo, hi = (max(lo, g + 1), hi) if g < target else (lo, min(hi, g - 1))
    out["outside"] = [o / max(1, c) for o, c in zip(outside, guesses)]
    out["middle"] = [m / max(1, c) for m, c in zip(middle, guesses)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="a run directory (rose run --out), holding trajectories.parquet")
    ap.add_argument("--block", type=int, default=20, help="steps per block")
    args = ap.parse_args()
    table = pq.read_table(os.path.join(args.run_dir, "trajectories.parquet"),
                          columns=["step", "env", "actions", "ground_truth", "env_reward"]).to_pylist()
    if not table or any(r["env"] != "guess" for r in table):
        raise SystemExit(f"{args.run_dir}: not a run of the guess environment")
    last = max(r["step"] for r in table)
    pct = lambda xs: " / ".join(f"{100 * x:4.1f}" for x in xs)  # noqa: E731
    print(f"{'steps':>9} {'reward':>7} {'found':>6} {'missed':>6} {'malf.':>6}  outside the interval, turns 1-5 (%)"
          f"      at its midpoint, turns 1-5 (%)")
    for lo in range(0, last + 1, args.block):
        rows = [r for r in table if lo <= r["step"] < lo + args.block]
        if rows:
            s = block_stats(rows)
            print(f"{lo:>4}-{min(lo + args.block, last + 1) - 1:<4} {s['reward']:7.3f} {100 * s['found']:5.1f}% "
                  f"{100 * s['missed']:5.1f}% {100 * s['malformed']:5.1f}%  {pct(s['outside'])}   {pct(s['middle'])}")


if __name__ == "__main__":
    main()
