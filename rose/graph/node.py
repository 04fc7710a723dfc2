"""Nodes and typed ports of a step graph.

A `Node` names an op and wires each of the op's input ports to an output port of another node
(`node.out("port")` returns that reference). Port types are checked at validation: a `PortType` is a
name plus, for data ports, the Arrow schema that travels on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class PortType:
    name: str  # e.g. "trajectories", "rollout_specs", "weights"
    schema: pa.Schema | None = None  # Arrow schema of the record batches on this port, if any
    partitioned: bool = False  # many partitions (one Dask task each) vs one value

    def accepts(self, other: "PortType") -> bool:
        if self.name != other.name or self.partitioned != other.partitioned:
            return False
        if self.schema is None or other.schema is None:
            return self.schema is other.schema
        return self.schema.equals(other.schema, check_metadata=False)

    def __str__(self) -> str:
        return f"{self.name}{'[]' if self.partitioned else ''}"


@dataclass(frozen=True)
class PortRef:
    """An output port of a node, used as the source of another node's input."""

    node: str
    port: str

    def __str__(self) -> str:
        return f"{self.node}.{self.port}"


@dataclass
class Node:
    name: str  # unique within the graph
    op: str  # registered op name
    inputs: dict[str, PortRef] = field(default_factory=dict)  # input port -> source output port
    params: dict[str, Any] = field(default_factory=dict)  # op parameters (plain values)

    def out(self, port: str) -> PortRef:
        return PortRef(self.name, port)
