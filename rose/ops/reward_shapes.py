"""Reward functions in the shapes users bring, and several of them weighted into one reward.

A reward function comes in one of three shapes, told apart by its parameters (or named with
`Reward(shape=...)`):

- "batch", ROSE's own: `fn(batch: pa.RecordBatch) -> Sequence[float]`, one value per row, in order.
- "verl": `compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict`,
  called once per trajectory, by keyword. data_source is the environment's name; solution_str the
  response (each policy turn's text followed by the environment's reply: everything after the prompt);
  ground_truth the environment's (`Env.ground_truth`, None if it has none); extra_info a dict of the
  trajectory's other fields (trajectory_id, env_seed, env_kwargs, prompt, actions, observations,
  num_turns, finish_reason, env_reward). A dict result holds the reward under "score" (verl's
  convention); its other keys are not used. One that raises fails that trajectory alone.
- "trl": `fn(completions, **kwargs) -> list[float]` (or `fn(prompts, completions, ...)`), called once
  for the batch by keyword: prompts and completions (text, one per trajectory), completion_ids (the
  policy's own tokens, all turns) and the trajectory columns above as lists. A function without
  **kwargs is given only the names it declares. TRL's None ("does not apply") is not a reward here:
  it fails that trajectory, like any value that is not a finite number.

`Rewards` weighs several functions into one reward, `sum(weight * value)`, and keeps each term's value
in the trajectory's `reward_terms`; the step metrics show each term's mean as `reward/<name>`.

    rewards = rose.Rewards.of({"correct": verl_score, "format": (format_ok, 0.2)})
    g = rl_step("calc", "calc", 16, 8, reward=rewards)
"""
from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Callable

import pyarrow as pa

SHAPES = ("batch", "verl", "trl")
VERL_PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")
TRL_PARAMS = ("prompts", "completions", "completion_ids")
# The trajectory columns a verl function gets in extra_info and a TRL function as keyword lists
COLUMNS = ("trajectory_id", "env", "env_seed", "env_kwargs", "ground_truth", "prompt", "actions", "observations",
           "num_turns", "finish_reason", "env_reward")
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True)
class RowFailure:
    """What a per-trajectory adapter returns in place of a value for a trajectory it could not score."""

    message: str  # e.g. "raised KeyError: 'x'": the reward op adds the function and the trajectory


def fn_name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def shape_of(fn: Callable) -> str:
    """The shape of reward function `fn` from its parameters; ValueError naming them if it has none."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: take it at its word
        return "batch"
    params = sig.parameters.values()
    names = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    required = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if "solution_str" in names:
        unknown = [n for n in required if n not in VERL_PARAMS]
        if not unknown:
            return "verl"
    elif "completions" in names:
        unknown = [n for n in required if n not in TRL_PARAMS + COLUMNS]
        if not unknown:
            return "trl"
    else:
        positional = [p for p in params if p.kind in _POSITIONAL or p.kind == p.VAR_POSITIONAL]
        if len(required) <= 1 and positional:
            return "batch"
    raise ValueError(f"reward function {fn_name(fn)!r} has parameters {sig}; expected one of: fn(batch) -> "
                     f"floats (one per trajectory); verl's compute_score(data_source, solution_str, ground_truth, "
                     f"extra_info) -> float | dict; TRL's fn(completions, **kwargs) -> list[float]")


def response(actions: list[str], observations: list[str]) -> str:
    """The conversation after the prompt as text: each action, then the environment's reply to it."""
    return "".join(a + o for a, o in zip_longest(actions, observations, fillvalue=""))


def _takes(fn) -> set[str] | None:
    """The keyword names `fn` takes; None if it takes any (**kwargs)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind not in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)}


def _only(offered: dict, names: set[str] | None) -> dict:
    return offered if names is None else {k: v for k, v in offered.items() if k in names}


def _columns(batch: pa.RecordBatch) -> dict[str, list]:
    return {c: batch.column(c).to_pylist() for c in COLUMNS}


def call_verl(fn, batch: pa.RecordBatch) -> list:
    names, cols, out = _takes(fn), _columns(batch), []
    for i in range(batch.num_rows):
        row = {c: cols[c][i] for c in COLUMNS}
        extra = {k: v for k, v in row.items() if k not in ("env", "ground_truth")}
        extra["env_kwargs"] = json.loads(row["env_kwargs"] or "{}")
        offered = {"data_source": row["env"], "solution_str": response(row["actions"], row["observations"]),
                   "ground_truth": row["ground_truth"], "extra_info": extra}
        try:
            v = fn(**_only(offered, names))
        except Exception as e:
            out.append(RowFailure(f"raised {type(e).__name__}: {e}"))
            continue
        if isinstance(v, dict):
            v = v["score"] if "score" in v else RowFailure(f"returned a dict without 'score' (keys {sorted(v)})")
        out.append(v)
    return out


def call_trl(fn, batch: pa.RecordBatch) -> list:
    offered = _columns(batch)
    masks, tokens = batch.column("loss_mask").to_pylist(), batch.column("token_ids").to_pylist()
    offered["prompts"] = offered["prompt"]
    offered["completions"] = [response(a, o) for a, o in zip(offered["actions"], offered["observations"])]
    offered["completion_ids"] = [[t for t, m in zip(ts, ms) if m] for ts, ms in zip(tokens, masks)]
    return list(fn(**_only(offered, _takes(fn))))


def call(shape: str, fn, batch: pa.RecordBatch) -> list:
    """`fn`'s values for the rows of `batch`, one each (a RowFailure where an adapter could not score one)."""
    if shape == "verl":
        return call_verl(fn, batch)
    if shape == "trl":
        return call_trl(fn, batch)
    return list(fn(batch))


@dataclass(frozen=True)
class Reward:
    """One reward function with its weight in a `Rewards` and its name in the metrics."""

    fn: Callable
    weight: float = 1.0  # its share: reward = sum(weight * value) over the terms
    name: str = ""  # "" -> the function's __name__
    shape: str = ""  # "batch" | "verl" | "trl"; "" -> told from the function's parameters

    def __post_init__(self):
        from rose.errors import config_check

        config_check(callable(self.fn), "Reward", "fn", self.fn, "a function")
        config_check(isinstance(self.weight, (int, float)) and not isinstance(self.weight, bool)
                     and math.isfinite(self.weight), "Reward", "weight", self.weight, "a finite number")
        config_check(self.shape in ("",) + SHAPES, "Reward", "shape", self.shape, f"one of {SHAPES} or ''")
        if not self.name:
            object.__setattr__(self, "name", fn_name(self.fn))
        if not self.shape:
            object.__setattr__(self, "shape", shape_of(self.fn))


@dataclass(frozen=True)
class Rewards:
    """Several reward functions weighed into one reward; each term is kept in `reward_terms`."""

    terms: tuple[Reward, ...] = field(default_factory=tuple)

    def __post_init__(self):
        from rose.errors import config_check

        config_check(len(self.terms) > 0 and all(isinstance(t, Reward) for t in self.terms), "Rewards", "terms",
                     self.terms, "one or more rose.Reward")
        names = [t.name for t in self.terms]
        config_check(len(set(names)) == len(names), "Rewards", "terms", names, "terms with distinct names")

    @classmethod
    def of(cls, spec: dict) -> Rewards:
        """From {name: fn | (fn, weight) | Reward}."""
        terms = []
        for name, v in spec.items():
            if isinstance(v, Reward):
                terms.append(Reward(v.fn, v.weight, name, v.shape))
            elif isinstance(v, tuple) and len(v) == 2:
                terms.append(Reward(v[0], v[1], name))
            else:
                terms.append(Reward(v, 1.0, name))
        return cls(tuple(terms))
