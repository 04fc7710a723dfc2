"""`GymTextEnv`: a gymnasium environment with discrete actions, spoken in text.

Subclass it with the gymnasium id, one word per action and a text rendering of observations
(`describe`); the adapter does the rest of the `Env` contract (rose/envs/base.py): `reset(seed)` makes
and seeds the gymnasium environment, `step(text)` reads one action word and steps it. Gymnasium
environments are deterministic in their reset seed and the actions taken, so a ROSE trajectory on one
replays (provenance) and resumes on another worker like any other.

A turn that is not exactly one known action word ends the episode with `malformed_reward`, as in the
built-in environments: it keeps negative advantages from pushing mass onto text that means nothing.
Gymnasium's `terminated` and `truncated` end the episode, and so does `max_turns`.
"""
from __future__ import annotations

import random

from rose.envs.base import StepResult


class GymTextEnv:
    """Base class; a subclass sets `name`, `gym_id`, `action_words` and implements `describe`."""

    name = "gym"
    gym_id: str = ""  # what `gymnasium.make` builds
    action_words: tuple[str, ...] = ()  # action i of the Discrete action space is the word action_words[i]
    max_turns = 8  # policy turns at most
    max_action_tokens = 4
    malformed_reward = -1.0  # a turn that is not one action word: this reward, and the episode ends

    def make_kwargs(self, seed: int) -> dict:
        """Keyword arguments of `gymnasium.make` for the episode of `seed` (e.g. a map drawn from it)."""
        return {}

    def describe(self, observation, info: dict) -> str:
        """The observation as the policy reads it (text ending in a newline)."""
        raise NotImplementedError

    def reset(self, seed: int) -> str:
        import gymnasium

        self._env = gymnasium.make(self.gym_id, **self.make_kwargs(seed))
        n = getattr(self._env.action_space, "n", None)
        if n != len(self.action_words):
            raise ValueError(f"{type(self).__name__}: {self.gym_id} has action space {self._env.action_space}; "
                             f"action_words names {len(self.action_words)} actions")
        obs, info = self._env.reset(seed=seed)
        self.turn = 0
        return self.describe(obs, info)

    def step(self, action: str) -> StepResult:
        words = action.split()
        if len(words) != 1 or words[0] not in self.action_words:
            return StepResult("", self.malformed_reward, True)
        obs, reward, terminated, truncated, info = self._env.step(self.action_words.index(words[0]))
        self.turn += 1
        done = bool(terminated or truncated) or self.turn >= self.max_turns
        return StepResult("" if done else self.describe(obs, info), float(reward), done)

    @classmethod
    def vocabulary(cls) -> list[str]:
        return list(cls.action_words)

    def expert(self) -> str | None:
        """The word a good policy plays now (demonstrations), or None for none known."""
        return None

    @classmethod
    def demonstration(cls, rng: random.Random, expert_p: float = 0.6, **kwargs) -> list[tuple[str, bool]]:
        """One episode played by the environment itself: the expert's word with probability `expert_p`
        (where it knows one), a random word otherwise. Valid play, far from perfect, so that RL has room."""
        env = cls(**kwargs)
        segments = [(env.reset(rng.randrange(2 ** 31)), False)]
        for _ in range(env.max_turns):
            best = env.expert()
            word = best if best is not None and rng.random() < expert_p else rng.choice(cls.action_words)
            result = env.step(word)
            segments += [(f"{word}\n", True), (result.observation, False)]
            if result.done:
                break
        return segments
