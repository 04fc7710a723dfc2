"""Lowering: a validated graph -> a flat list of `TaskSpec`s with Dask annotations.

A partitioned port lowers to one task per partition; ops map partitions one to one or gather them.
Task keys are deterministic (`{graph}-{node}-s{step}-{i}`) so a trajectory's task key, like its id,
is stable across retries.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from rose.runtime.protocol import Annotation


@dataclass(frozen=True)
class Ref:
    """A reference to another task's result (a Dask key)."""

    key: str


@dataclass
class TaskSpec:
    key: str  # unique Dask key
    fn: Callable  # runs on a worker
    args: tuple = ()  # may hold Refs (also inside lists)
    kwargs: dict[str, Any] = field(default_factory=dict)
    role: str | None = None  # worker role that must run it: trainer | dedicated | None (any)
    annotations: dict[str, Any] = field(default_factory=dict)  # rose-role, step, weight_version, ...
    retries: int = 0
    workers: tuple[str, ...] | None = None  # pin to these addresses (overrides role)
    node: str = ""  # the graph node it was lowered from (set by `lower`)
    phase: str = ""  # its op's phase: rollout | reward | train | sync (set by `lower`)


@dataclass(frozen=True)
class LowerContext:
    step: int  # RL step this graph runs
    weight_version: int  # weights the step's rollouts must use
    graph: str  # graph name, used in keys
    rollout_workers: tuple[str, ...] = ()  # addresses of workers that hold rollout engines
    seed: int = 0  # run seed: environment seeds and sampling seeds derive from it
    temperature: float = 1.0  # behaviour-policy sampling temperature (the trainer scores at the same)
    top_p: float = 1.0
    request_timeout_s: float = 600.0  # a policy turn's deadline (EngineConfig.request_timeout_s)
    env_timeout_s: float = 60.0  # an environment call's deadline (EngineConfig.env_timeout_s)


@dataclass
class LoweredGraph:
    tasks: list[TaskSpec]
    outputs: dict[tuple[str, str], list]  # (node, port) -> partitions (Refs or values)

    def keys_of(self, node: str, port: str) -> list[str]:
        return [p.key for p in self.outputs[(node, port)] if isinstance(p, Ref)]

    def input_keys(self, node, port: str) -> list[str]:
        """Keys of the partitions wired into `node`'s input `port`."""
        ref = node.inputs[port]
        return self.keys_of(ref.node, ref.port)


def lower(graph, ctx: LowerContext) -> LoweredGraph:
    from rose.graph.ops import get_op

    tasks: list[TaskSpec] = []
    outputs: dict[tuple[str, str], list] = {}
    for node in graph.validate():
        op = get_op(node.op)
        ins = {port: outputs[(ref.node, ref.port)] for port, ref in node.inputs.items()}
        node_tasks, node_outs = op.lower(node, ctx, ins)
        for t in node_tasks:
            t.node = node.name
            t.phase = op.phase
            t.annotations.setdefault("step", ctx.step)
            t.annotations.setdefault(Annotation.VERSION, ctx.weight_version)
            if t.role:
                t.annotations.setdefault(Annotation.ROLE, t.role)
        tasks += node_tasks
        for port in op.outputs:
            outputs[(node.name, port)] = node_outs[port]
    return LoweredGraph(tasks, outputs)


def task_key(ctx: LowerContext, node, i: int | str | None = None) -> str:
    base = f"{ctx.graph}-{node.name}-s{ctx.step}"
    return base if i is None else f"{base}-{i}"
