"""The environment contract for multi-turn rollouts.

An `Env` is a small, deterministic state machine: `reset(seed)` returns the first observation and
`step(action_text)` returns the next observation, a reward and whether the episode is over. Given the
same seed and the same actions it produces the same observations, so a trajectory can be replayed or
resumed on another worker from (seed, actions so far).

Environments speak plain text, one action per policy turn. The rollout op tokenizes observations with
the policy's tokenizer and marks them `loss_mask=False`.
"""
from __future__ import annotations

import importlib
import random
import sys
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class StepResult:
    observation: str  # text appended to the context (environment tokens, not trained on)
    reward: float  # reward for this turn; the episode's reward is the sum
    done: bool  # no further policy turn


@runtime_checkable
class Env(Protocol):
    name: str  # registry name, e.g. "guess"
    max_turns: int  # policy turns at most; the rollout stops with finish_reason "max_turns"
    max_action_tokens: int  # tokens the policy may write in one turn
    # Rollouts call `reset` and `step` in a thread of their own, under `EngineConfig.env_timeout_s`: a
    # call may block on I/O or tools; one that raises, or runs past the deadline, fails its trajectory
    # (naming the env, the turn and the trajectory id) and nothing else. An environment whose calls are
    # pure Python that returns in microseconds and cannot block may set the class attribute
    # `inline = True`: its calls then run directly on the worker's event loop (no thread handoff, which
    # costs more than such a call; no deadline, which it cannot need). One that raises still fails only
    # its trajectory. It counts only on the class that declares it (`is_inline`): a subclass of an
    # inline environment may add a tool call that blocks, and keeps its deadline unless it says again.

    # Optional: after `reset`, an attribute `ground_truth` (any value; recorded as its str) holds the
    # episode's answer, which the trajectory keeps for reward functions (verl's `ground_truth`).

    def reset(self, seed: int) -> str:
        """Start an episode; return the first observation (the prompt)."""

    def step(self, action: str) -> StepResult:
        """Apply one policy action (the decoded text of one turn)."""

    @classmethod
    def vocabulary(cls) -> list[str]:
        """Words this environment uses, for building a tiny word-level tokenizer."""

    @classmethod
    def demonstration(cls, rng: random.Random) -> list[tuple[str, bool]]:
        """One synthetic episode as (text, is_policy) segments, for the supervised warm start."""


def is_inline(cls: type) -> bool:
    """Whether environment class `cls` itself declares `inline = True` (inherited does not count)."""
    return vars(cls).get("inline") is True


def inline_by_name(name: str) -> bool:
    """Whether environment `name` declared its calls instant (`is_inline`). Only a class whose module is
    loaded already is asked (importing a user's module is itself a call that may block), and any error
    leaves the answer to the construction call, which reports it."""
    if ":" in name and name.partition(":")[0] not in sys.modules:
        return False
    try:
        return is_inline(env_class(name))
    except Exception:
        return False


def replay(env: Env, seed: int, actions: list[str]) -> tuple[str, list[StepResult]]:
    """Rebuild an environment's state from its seed and the actions so far."""
    first = env.reset(seed)
    return first, [env.step(a) for a in actions]


_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: make an environment available by name to pipelines and workers."""
    _REGISTRY[cls.name] = cls
    return cls


def env_class(name: str) -> type:
    """A registered name ("guess") or an import path to a user's class ("my_pkg.envs:MazeEnv")."""
    from rose.errors import ConfigError

    _load_builtin()
    if not isinstance(name, str):
        raise ConfigError(f"environment {name!r} must be a registered name or 'module:Class' (a string)")
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except Exception as e:  # not only ImportError: a user's module may fail in any way while it loads
            raise ConfigError(f"cannot import environment {name!r}: {type(e).__name__}: {e}") from None
        if not callable(cls):
            raise ConfigError(f"environment {name!r} is a {type(cls).__name__}, not a class")
        return cls
    raise ConfigError(f"unknown environment {name!r}; known: {sorted(_REGISTRY)} or 'module:Class'")


def make_env(name: str, **kwargs) -> Env:
    return env_class(name)(**kwargs)


def _load_builtin() -> None:
    from rose.envs import calc, frozenlake, guess  # noqa: F401  (registration side effect)
