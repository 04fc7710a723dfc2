"""`frozenlake`: gymnasium's FrozenLake through the text adapter (rose/envs/gym.py), on a new map per seed.

Each episode draws its own 4x4 map from the seed (gymnasium's `generate_random_map`: always a path from
start to goal), so the policy must read the map, not memorise one. Observation text (word tokens): the
map row by row with the player's cell as `P`:

    P F F F
    F H F H
    F F F H
    H F F G

Actions: `left`, `down`, `right`, `up` (one word a turn). Reward 1 on reaching `G`; falling into a
hole `H` or running out of turns ends the episode with 0; a malformed action ends it with -1. The
lake is not slippery by default (moves are deterministic; `slippery=True` for gymnasium's version).
"""
from __future__ import annotations

from collections import deque

from rose.envs.base import register
from rose.envs.gym import GymTextEnv

_MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}


@register
class FrozenLakeEnv(GymTextEnv):
    name = "frozenlake"
    inline = False  # builds a gymnasium environment at reset: keep it off the worker's event loop
    gym_id = "FrozenLake-v1"
    action_words = ("left", "down", "right", "up")  # gymnasium's action order
    max_action_tokens = 2  # the word and the newline

    def __init__(self, size: int = 4, frozen_p: float = 0.8, slippery: bool = False, max_turns: int = 8):
        if not (2 <= size <= 8 and 0 < frozen_p <= 1 and max_turns >= 1):
            raise ValueError(f"FrozenLakeEnv needs 2 <= size <= 8, 0 < frozen_p <= 1, max_turns >= 1; got "
                             f"size={size} frozen_p={frozen_p} max_turns={max_turns}")
        self.size, self.frozen_p, self.slippery, self.max_turns = size, frozen_p, slippery, max_turns
        self.ground_truth: str | None = None  # after reset: the shortest path's length, in moves

    def make_kwargs(self, seed: int) -> dict:
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map

        self.desc = generate_random_map(size=self.size, p=self.frozen_p, seed=seed)
        return {"desc": self.desc, "is_slippery": self.slippery}

    def reset(self, seed: int) -> str:
        text = super().reset(seed)
        self.ground_truth = str(len(self._path_from(0)))
        return text

    def describe(self, observation, info: dict) -> str:
        self.position = int(observation)
        cells = [list(row) for row in self.desc]
        cells[self.position // self.size][self.position % self.size] = "P"
        return "".join(" ".join(row) + "\n" for row in cells)

    def expert(self) -> str | None:
        path = self._path_from(self.position)
        return path[0] if path else None

    def _path_from(self, start: int) -> list[str]:
        """The moves of a shortest path from cell `start` to the goal over frozen cells (breadth first)."""
        n = self.size
        seen, queue = {start: []}, deque([start])
        while queue:
            cell = queue.popleft()
            if self.desc[cell // n][cell % n] == "G":
                return seen[cell]
            for word, (dr, dc) in _MOVES.items():
                r, c = cell // n + dr, cell % n + dc
                nxt = r * n + c
                if 0 <= r < n and 0 <= c < n and nxt not in seen and self.desc[r][c] != "H":
                    seen[nxt] = seen[cell] + [word]
                    queue.append(nxt)
        return []

    @classmethod
    def vocabulary(cls) -> list[str]:
        return [*cls.action_words, "S", "F", "H", "G", "P"]
