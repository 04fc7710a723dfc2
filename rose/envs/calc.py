"""`calc`: answer a multiplication question, with a calculator tool.

Episode text: `what is A * B \n`; the policy may call the tool with `calc A * B \n`, whose answer
`= P \n` enters the context as environment tokens, then answers with `answer N \n`.
Reward: a correct answer 1.0 (0.9 if it took more than two turns); a wrong answer 0; a malformed
action or tool call -1. The model cannot multiply by itself; it learns to call the tool and copy.
"""
from __future__ import annotations

import random

from rose.envs.base import StepResult, register

MALFORMED_REWARD = -1.0


def _parse_int(word: str) -> int | None:
    return int(word) if word.isdigit() else None


@register
class CalcEnv:
    name = "calc"
    inline = True  # reset and step are pure Python, microseconds: run on the event loop
    max_action_tokens = 6

    def __init__(self, low: int = 2, high: int = 12, max_turns: int = 3):
        if not (0 <= low <= high <= 12):
            raise ValueError(f"CalcEnv needs 0 <= low <= high <= 12, got low={low} high={high}")
        self.low, self.high, self.max_turns = low, high, max_turns
        self.a = self.b = 0
        self.ground_truth: str | None = None  # str(a * b) after reset
        self.turn = 0

    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        self.a, self.b = rng.randint(self.low, self.high), rng.randint(self.low, self.high)
        self.ground_truth = str(self.a * self.b)
        self.turn = 0
        return f"what is {self.a} * {self.b}\n"

    def step(self, action: str) -> StepResult:
        self.turn += 1
        words = action.split()
        out_of_turns = self.turn >= self.max_turns
        if len(words) == 4 and words[0] == "calc" and words[2] in "+-*" and len(words[2]) == 1:
            x, y = _parse_int(words[1]), _parse_int(words[3])
            if x is None or y is None:
                return StepResult("", MALFORMED_REWARD, True)
            value = {"+": x + y, "-": x - y, "*": x * y}[words[2]]
            if not 0 <= value <= 200:  # the tool only answers within its range
                return StepResult("error\n", 0.0, out_of_turns)
            return StepResult(f"= {value}\n", 0.0, out_of_turns)
        if len(words) == 2 and words[0] == "answer" and _parse_int(words[1]) is not None:
            correct = int(words[1]) == self.a * self.b
            reward = (1.0 if self.turn <= 2 else 0.9) if correct else 0.0
            return StepResult("correct\n" if correct else "wrong\n", reward, True)
        return StepResult("", MALFORMED_REWARD, True)

    @classmethod
    def vocabulary(cls) -> list[str]:
        return ["what", "is", "calc", "answer", "=", "*", "+", "-", "correct", "wrong", "error"]

    @classmethod
    def demonstration(cls, rng: random.Random, low: int = 2, high: int = 12, max_turns: int = 3):
        # Mostly correct tool use; a fifth of the answers are off by a little so the warm-started
        # policy copies imperfectly and RL has something to fix.
        a, b = rng.randint(low, high), rng.randint(low, high)
        p = a * b
        ans = p if rng.random() < 0.8 else max(0, p + rng.choice([-2, -1, 1, 2]))
        return [
            (f"what is {a} * {b}\n", False),
            (f"calc {a} * {b}\n", True),
            (f"= {p}\n", False),
            (f"answer {ans}\n", True),
            ("correct\n" if ans == p else "wrong\n", False),
        ]
