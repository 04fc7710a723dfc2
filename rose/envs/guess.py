"""`guess`: find a hidden number with higher/lower feedback over several turns.

Episode text (word tokens): `find 1 16 \n` then per turn `guess N \n` (policy) and
`higher \n` / `lower \n` / `correct \n` (environment). Reward when found on turn t (1-based):
1 - 0.1 (t - 1); nothing found after `max_turns`: 0; a malformed or out-of-range action ends the
episode with -1 (it keeps negative advantages from pushing mass onto unseen tokens).
Random guessing scores about 0.23 with 16 numbers and 5 turns; binary search about 0.76.
"""
from __future__ import annotations

import random

from rose.envs.base import StepResult, register

MALFORMED_REWARD = -1.0


@register
class GuessEnv:
    name = "guess"
    inline = True  # reset and step are pure Python, microseconds: run on the event loop
    max_action_tokens = 4

    def __init__(self, low: int = 1, high: int = 16, max_turns: int = 5):
        if not (0 <= low < high <= 100):
            raise ValueError(f"GuessEnv needs 0 <= low < high <= 100, got low={low} high={high}")
        self.low, self.high, self.max_turns = low, high, max_turns
        self.target: int | None = None
        self.ground_truth: str | None = None  # str(target) after reset
        self.turn = 0

    def reset(self, seed: int) -> str:
        self.target = random.Random(seed).randint(self.low, self.high)
        self.ground_truth = str(self.target)
        self.turn = 0
        return f"find {self.low} {self.high}\n"

    def step(self, action: str) -> StepResult:
        assert self.target is not None, "step() before reset()"
        self.turn += 1
        words = action.split()
        if len(words) != 2 or words[0] != "guess" or not words[1].isdigit():
            return StepResult("", MALFORMED_REWARD, True)
        n = int(words[1])
        if not self.low <= n <= self.high:
            return StepResult("", MALFORMED_REWARD, True)
        if n == self.target:
            return StepResult("correct\n", 1.0 - 0.1 * (self.turn - 1), True)
        feedback = "higher" if self.target > n else "lower"
        return StepResult(f"{feedback}\n", 0.0, self.turn >= self.max_turns)

    @classmethod
    def vocabulary(cls) -> list[str]:
        return ["find", "guess", "higher", "lower", "correct"]

    @classmethod
    def demonstration(cls, rng: random.Random, low: int = 1, high: int = 16, max_turns: int = 5):
        # Random guesses consistent with the feedback so far: valid play, far from optimal, so that
        # RL has room to improve (binary search is the ceiling).
        target = rng.randint(low, high)
        lo, hi = low, high
        segs: list[tuple[str, bool]] = [(f"find {low} {high}\n", False)]
        for _ in range(max_turns):
            g = rng.randint(lo, hi)
            segs.append((f"guess {g}\n", True))
            if g == target:
                segs.append(("correct\n", False))
                break
            if g < target:
                lo = g + 1
                segs.append(("higher\n", False))
            else:
                hi = g - 1
                segs.append(("lower\n", False))
        return segs
