"""Step graphs: nodes with typed ports, validation, lowering to Dask tasks; `rl_step` builds the RL step."""
from rose.graph.graph import Graph
from rose.graph.lower import LowerContext, LoweredGraph, Ref, TaskSpec, lower
from rose.graph.node import Node, PortRef, PortType
from rose.graph.ops import PHASES, Op, get_op, register_op
from rose.graph.rl_step import rl_step

__all__ = ["Graph", "LowerContext", "LoweredGraph", "Node", "Op", "PortRef", "PortType", "Ref", "TaskSpec",
           "PHASES", "get_op", "lower", "register_op", "rl_step"]
