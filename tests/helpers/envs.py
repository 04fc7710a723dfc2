"""Environments for tests, importable by worker processes as "tests.helpers.envs:Name"."""
from __future__ import annotations

import random
import threading

from rose.envs.base import StepResult
from rose.envs.guess import GuessEnv


class RaisingEnv(GuessEnv):
    """Plays like `guess`, but raises on the first policy turn for odd seeds."""

    name = "raising"

    def step(self, action):
        if self.seed % 2 == 1:
            raise RuntimeError(f"environment exploded on purpose (seed {self.seed})")
        return super().step(action)

    def reset(self, seed):
        self.seed = seed
        return super().reset(seed)


class SlowEnv(GuessEnv):
    """Plays like `guess`, but each step waits 0.3 s (a tool call): rollouts stay in flight long enough
    to be shed or to lose their worker."""

    name = "slow"

    def step(self, action):
        import time

        time.sleep(0.3)
        return super().step(action)


class LongPromptEnv(GuessEnv):
    """Its first observation is longer than any test model's context."""

    name = "long_prompt"

    def reset(self, seed):
        super().reset(seed)
        return "find 1 16 " * 100 + "\n"


class ScriptedEnv:
    """A minimal env for unit tests: ends after `turns` turns, reward 1 per turn that said 'ok'."""

    name = "scripted"
    max_action_tokens = 4

    def __init__(self, turns: int = 2, max_turns: int = 3):
        self.turns, self.max_turns, self.t = turns, max_turns, 0

    def reset(self, seed):
        self.t = 0
        return f"start {seed}\n"

    def step(self, action):
        self.t += 1
        return StepResult(f"obs {self.t}\n", 1.0 if "ok" in action else 0.0, self.t >= self.turns)

    @classmethod
    def vocabulary(cls):
        return ["start", "obs", "ok"]

    @classmethod
    def demonstration(cls, rng: random.Random):
        return [("start 1\n", False), ("ok\n", True), ("obs 1\n", False)]


class ChattyEnv(GuessEnv):
    """Six turns whatever the policy says, each answered with seven tokens of `guess` words: contexts
    grow past 60 tokens, so a step's prefills of late turns exceed an engine iteration's token budget."""

    name = "chatty"
    turns = 6

    def __init__(self):
        super().__init__(max_turns=self.turns)

    def reset(self, seed):
        super().reset(seed)
        self.t = 0
        return "find 1 16\n"

    def step(self, action):
        self.t += 1
        return StepResult("higher lower higher lower higher lower\n", 0.1, self.t >= self.turns)


class HangingEnv(GuessEnv):
    """Plays like `guess`, but its first `step` hangs for odd seeds (a tool that never answers): it
    blocks until `HangingEnv.release` is set, or 30 s, so code without a deadline fails a test
    instead of hanging it."""

    name = "hanging"
    release = threading.Event()

    def reset(self, seed):
        self.seed = seed
        return super().reset(seed)

    def step(self, action):
        if self.seed % 2 == 1:
            HangingEnv.release.wait(30)
        return super().step(action)


class BadInputsEnv(GuessEnv):
    """One environment for every way an environment can go wrong, chosen by the episode's seed % 4:
    0 plays `guess`; 1 raises in `step`; 2 hangs in `step` (see HangingEnv); 3 opens with a prompt
    longer than any test model's context."""

    name = "bad_inputs"

    @staticmethod
    def kind(seed: int) -> str:
        return ("ok", "raises", "hangs", "long_prompt")[seed % 4]

    def reset(self, seed):
        self.seed = seed
        first = super().reset(seed)
        return "find 1 16 " * 100 + "\n" if self.kind(seed) == "long_prompt" else first

    def step(self, action):
        if self.kind(self.seed) == "raises":
            raise RuntimeError(f"environment exploded on purpose (seed {self.seed})")
        if self.kind(self.seed) == "hangs":
            HangingEnv.release.wait(30)
        return super().step(action)


class NanRewardEnv(GuessEnv):
    """Plays like `guess`, but pays a NaN reward on its first step."""

    name = "nan_reward"

    def step(self, action):
        return StepResult(super().step(action).observation, float("nan"), False)
