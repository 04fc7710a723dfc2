"""A `Graph` of op nodes: built by a pipeline, validated, then lowered to Dask tasks.

It knows nothing of RL; ops give it meaning. Example:

    g = Graph("guess")
    specs = g.add("prompts", "prompts", env="guess", num_groups=16, group_size=8)
    traj = g.add("rollout", "rollout", inputs={"specs": specs.out("specs")})
    g.validate()   # raises GraphError naming the node and port
"""
from __future__ import annotations

from rose.errors import GraphError
from rose.graph.node import Node, PortRef


class Graph:
    def __init__(self, name: str):
        self.name = name
        self.nodes: dict[str, Node] = {}  # insertion order is the build order

    def add(self, name: str, op: str, inputs: dict[str, PortRef] | None = None, **params) -> Node:
        from rose.graph.validate import check_node

        if isinstance(name, str) and name in self.nodes:
            raise GraphError(f"duplicate node name {name!r}", node=name)
        node = Node(name, op, dict(inputs) if isinstance(inputs, dict) else ({} if inputs is None else inputs),
                    params)
        check_node(node)  # a wrong type is named here, where the pipeline wrote it
        self.nodes[name] = node
        return node

    def validate(self) -> list[Node]:
        """Check the whole graph; return its nodes in dependency order. Raises GraphError."""
        from rose.graph.validate import validate

        return validate(self)

    def validate_step(self) -> list:
        """`validate`, plus what the runner needs of an RL step graph (one train node, one sync node)."""
        from rose.graph.validate import validate_step

        return validate_step(self)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, nodes={list(self.nodes)})"
