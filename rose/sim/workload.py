"""What the simulated cluster is asked to do: rollout groups a step, and serving load over time.

A group (one prompt, `group_size` multi-turn trajectories) is what a rollout task runs, as in the
runtime. Its trajectories decode side by side; the group's decode lasts as long as its longest one,
while the batch it adds to an engine shrinks as the shorter ones end, so a group counts as
`occupancy` = (sum of its trajectories' tokens) / (its longest's) sequences of the engine's batch.
Environment latency of the longest trajectory's turns is spent after its decode (an approximation
that keeps a group at two events; with steady engine speed the total is the same).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from rose.runtime.coserve.traffic import azure_trace
from rose.runtime.dapo import more_groups
from rose.sim.config import SimConfig


@dataclass
class Groups:
    """A batch of rollout groups, as arrays of shape (groups,)."""

    decode_tokens: np.ndarray  # generated tokens of the longest trajectory (the group's decode length)
    occupancy: np.ndarray  # mean sequences of the group in the engine's batch while it decodes
    env_s: np.ndarray  # environment latency of the longest trajectory, summed over its turns (s)
    train_tokens: np.ndarray  # prompt + generated tokens over the group's trajectories (trained on)
    varied: np.ndarray  # bool: its rewards vary (DAPO keeps it)

    def __len__(self) -> int:
        return len(self.decode_tokens)


def sample_groups(cfg: SimConfig, n: int, rng: np.random.Generator, varied_p: float = 1.0) -> Groups:
    g, tmax = cfg.group_size, cfg.turns_max
    turns = rng.integers(cfg.turns_min, tmax + 1, size=(n, g))
    lengths = rng.lognormal(math.log(cfg.tokens_per_turn), cfg.length_sigma, size=(n, g, tmax))
    lengths *= np.arange(tmax)[None, None, :] < turns[:, :, None]
    tokens = np.minimum(lengths.sum(axis=2), cfg.max_tokens)  # (n, g)
    longest = tokens.argmax(axis=1)
    dmax = np.maximum(tokens.max(axis=1), 1.0)
    lt = turns[np.arange(n), longest]
    env = rng.gamma(np.maximum(lt, 1), cfg.env_latency_s) if cfg.env_latency_s > 0 else np.zeros(n)
    return Groups(decode_tokens=dmax, occupancy=tokens.sum(axis=1) / dmax, env_s=env,
                  train_tokens=tokens.sum(axis=1) + g * cfg.prompt_tokens, varied=rng.random(n) < varied_p)


def varied_fraction(cfg: SimConfig, step: int, rng: np.random.Generator) -> float:
    """DAPO: the share of groups whose rewards vary at `step`. As the policy learns, more groups are
    solved by every sample (reward all equal), so the share falls from ~0.85 to ~0.15 over the run,
    with noise: demand swings up to ~5.7x between steps (the range published for DAPO runs)."""
    if cfg.algorithm != "dapo":
        return 1.0
    trend = 0.85 - 0.7 * step / max(1, cfg.steps - 1)
    return float(np.clip(trend + rng.normal(0, 0.05), 0.15, 0.9))


def next_round(cfg: SimConfig, sampled: int, kept: int, rounds: int) -> int:
    """Groups the next rollout round of a step asks for (the runtime's DAPO driver decision)."""
    if cfg.algorithm != "dapo":
        return 0 if rounds else cfg.prompts
    return more_groups(cfg.prompts, sampled, kept, rounds, max_rounds=8)


# --- serving load ---------------------------------------------------------------------------------

@lru_cache(maxsize=4)
def azure_requests(path: str) -> np.ndarray:
    """(requests, 3) arrival s, prompt tokens, generated tokens of an Azure-format CSV, unscaled and
    unclipped (read once: every simulated run of a matrix replays the same file)."""
    big = 1 << 40
    return np.array([(a.t, a.prompt_tokens, a.max_tokens) for a in azure_trace(path, max_prompt=big, max_gen=big)])


def _azure_profile(path: str, bucket_s: float = 60.0) -> np.ndarray:
    """Arrivals per bucket of the Azure-format CSV, normalised to mean 1."""
    counts = np.bincount((azure_requests(path)[:, 0] // bucket_s).astype(int)).astype(float)
    return counts / counts.mean()


class ServingLoad:
    """Request rate of every serving instance, tick by tick (`at(tick)`: (instances,) req/s).

    Instances replay the same shape from different offsets (as a fleet behind a load balancer sees
    one trace, shifted per instance by routing), scaled to mean `serving_rps`."""

    def __init__(self, cfg: SimConfig, azure_csv: str, instances: int, rng: np.random.Generator):
        self.cfg, self.n, self.rng = cfg, instances, rng
        self.phase = rng.uniform(0, 2 * math.pi, size=instances)  # diurnal: where each instance's day starts
        self.profile = None
        if cfg.trace not in ("none", "flat", "diurnal", "bursty"):
            self.profile = _azure_profile(azure_csv if cfg.trace == "azure" else cfg.trace)
            self.offset = rng.integers(0, len(self.profile), size=instances)

    def at(self, tick: int) -> np.ndarray:
        cfg, t = self.cfg, tick * self.cfg.load_tick_s
        if cfg.trace == "none" or self.n == 0:
            return np.zeros(self.n)
        if cfg.trace == "flat":
            shape = np.ones(self.n)
        elif cfg.trace == "diurnal":  # a 24-hour swing between 0.3x and 1.7x of the mean
            shape = 1 + 0.7 * np.sin(2 * math.pi * t / 86_400 + self.phase)
        elif cfg.trace == "bursty":  # on/off: 4x the base for a fifth of the ticks
            shape = np.where(self.rng.random(self.n) < 0.2, 4.0, 1.0) / (0.2 * 4 + 0.8)
        else:
            shape = self.profile[(int(t // 60.0) + self.offset) % len(self.profile)]
        return cfg.serving_rps * shape
