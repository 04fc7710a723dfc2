"""Typed exceptions. An `assert` is our bug; one of these is the caller's mistake.

Every exception pickles with its context (it crosses Dask), and its message names what was
wrong: the node and port, the field and value, the trajectory id, the step, the weight version.
"""
from __future__ import annotations

import math


class RoseError(Exception):
    """Base class. `context` holds the fields that locate the failure (step, trajectory_id, ...)."""

    def __init__(self, message: str, **context):
        super().__init__(message)
        self.message = message
        self.context = context

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.context))

    def __str__(self) -> str:
        if not self.context:
            return self.message
        where = ", ".join(f"{k}={v!r}" for k, v in self.context.items())
        return f"{self.message} [{where}]"


def _rebuild(cls, message, context):
    return cls(message, **context)


class ConfigError(RoseError, ValueError):
    """A config field has a value that is not allowed."""


class GraphError(RoseError):
    """A pipeline graph is malformed: cycle, unknown op, missing input, mistyped port."""


class ModelError(RoseError):
    """A model directory does not exist or does not hold a causal language model."""


class RewardError(RoseError):
    """A reward function returned something unusable (NaN, inf, wrong length)."""


class TrajectoryError(RoseError):
    """A single trajectory cannot go on (prompt too long, environment failure)."""


class PromptTooLongError(TrajectoryError):
    """A prompt (or prompt + tokens so far) does not fit the model's context."""


class EnvError(TrajectoryError):
    """An environment's reset or step raised, passed `env_timeout_s`, or returned something unusable."""


class RunError(RoseError):
    """A run stopped at a step; `.report` holds the steps that finished (set by rose.run)."""

    report = None


class EngineError(RoseError):
    """The inference engine refused a request or failed."""


def config_check(ok: bool, cls_name: str, field: str, value, allowed: str) -> None:
    """Raise ConfigError naming the config class, the field, the value and what is allowed."""
    if not ok:
        raise ConfigError(f"{cls_name}.{field}={value!r} is not allowed: {allowed}")


def positive_check(cls_name: str, field: str, value, allow_zero: bool = False) -> None:
    """config_check that `value` is a finite number > 0 (>= 0 with `allow_zero`)."""
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    config_check(ok, cls_name, field, value, ">= 0" if allow_zero else "> 0")
