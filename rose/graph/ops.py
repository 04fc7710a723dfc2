"""The op contract and registry. An op declares typed ports and its phase, and lowers a node to task specs.

An op never touches Dask: `lower` returns plain `TaskSpec` records (decide), and
`rose.graph.submit` turns them into Dask tasks (act). Ops register themselves with `@register_op`
when their module is imported (the built-in ones in `rose.ops`, imported with the `rose` package);
this layer imports no op.
"""
from __future__ import annotations

from typing import Any, ClassVar

from rose.graph.node import PortType

_OPS: dict[str, "Op"] = {}

# The phases of an RL step, in order. The runner submits and times a step by phase: rollout and reward
# tasks go first, the train task when the runner says (asynchronous runs hold it back), then the sync.
PHASES = ("rollout", "reward", "train", "sync")


class Op:
    name: ClassVar[str]
    phase: ClassVar[str]  # one of PHASES
    inputs: ClassVar[dict[str, PortType]] = {}
    outputs: ClassVar[dict[str, PortType]] = {}
    optional_inputs: ClassVar[frozenset[str]] = frozenset()
    params: ClassVar[dict[str, type | tuple[type, ...]]] = {}  # parameter name -> accepted type(s)
    required_params: ClassVar[frozenset[str]] = frozenset()

    def check_params(self, params: dict[str, Any]) -> None:
        """Raise ValueError/TypeError naming a bad parameter."""
        for k in self.required_params - params.keys():
            raise ValueError(f"missing parameter {k!r}")
        for k, v in params.items():
            if k not in self.params:
                raise ValueError(f"unknown parameter {k!r}; known: {sorted(self.params)}")
            want = self.params[k]
            # bool is an int to isinstance, never a count or a size to a pipeline
            if not isinstance(v, want) or (isinstance(v, bool) and bool not in _types(want)):
                raise TypeError(f"parameter {k!r}={v!r} should be {_type_names(want)}")

    def lower(self, node, ctx, inputs: dict[str, list]) -> tuple[list, dict[str, list]]:
        """Return (task specs, {output port: [partition ...]}); a partition is a Ref or a plain value."""
        raise NotImplementedError


def _types(want) -> tuple:
    return want if isinstance(want, tuple) else (want,)


def _type_names(want) -> str:
    return " or ".join("None" if t is type(None) else getattr(t, "__name__", str(t)) for t in _types(want))


def register_op(cls: type[Op]) -> type[Op]:
    if getattr(cls, "phase", None) not in PHASES:
        raise TypeError(f"op {cls.name!r} declares phase {getattr(cls, 'phase', None)!r}; one of {PHASES}")
    _OPS[cls.name] = cls()
    return cls


def get_op(name: str) -> Op:
    if name not in _OPS:
        raise KeyError(f"unknown op {name!r}; known ops: {sorted(_OPS)}")
    return _OPS[name]
