"""Step graphs: nodes with typed ports, validation, lowering to Dask tasks."""
from rose.graph.graph import Graph
from rose.graph.lower import LowerContext, LoweredGraph, Ref, TaskSpec, lower
from rose.graph.node import Node, PortRef, PortType
from rose.graph.ops import Op, get_op, register_op

__all__ = ["Graph", "LowerContext", "LoweredGraph", "Node", "Op", "PortRef", "PortType", "Ref", "TaskSpec",
           "get_op", "lower", "register_op"]
