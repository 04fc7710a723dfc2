"""Graph validation: every problem is reported before any worker does work.

Checks, in order, each raising `GraphError` that names the node (and port):
the shape of each node (a Node under its own name, a string op, inputs wired to `PortRef`s, params
keyed by strings: pipelines build and mutate graphs by hand, so nothing below takes these for granted);
unknown op; unknown input port; input wired to a missing node or a port that node does not have;
required input not wired; port type mismatch; bad op parameters; cycles. `validate_step` adds what
the runner needs of an RL step graph (one train node, one sync node, rollouts to train on).
"""
from __future__ import annotations

from rose.errors import GraphError
from rose.graph.node import Node, PortRef


def _label(x):
    """A value to name in an error's context: itself if a string, else its repr (context must pickle)."""
    return x if isinstance(x, str) else repr(x)


def check_node(node, key=None) -> None:
    """The shape every later check takes for granted, for one node (`key`: its key in graph.nodes)."""
    if not isinstance(node, Node):
        raise GraphError(f"graph entry {key!r} is a {type(node).__name__}, not a Node", node=_label(key))
    name = _label(node.name)
    if not isinstance(node.name, str) or not node.name:
        raise GraphError(f"node name {node.name!r} must be a non-empty string", node=name)
    if key is not None and node.name != key:
        raise GraphError(f"node {node.name!r} is held under the key {key!r} in graph.nodes; a node's name and "
                         f"its key must agree (add nodes with Graph.add)", node=name)
    if not isinstance(node.op, str):
        raise GraphError(f"op {node.op!r} must be the name of a registered op (a string)", node=name)
    if not isinstance(node.inputs, dict):
        raise GraphError(f"inputs {node.inputs!r} must be a dict of input port -> another node's output "
                         f"(node.out('port'))", node=name)
    for port, ref in node.inputs.items():
        if not isinstance(port, str):
            raise GraphError(f"input port {port!r} must be a string", node=name, port=_label(port))
        if not (isinstance(ref, PortRef) and isinstance(ref.node, str) and isinstance(ref.port, str)):
            raise GraphError(f"input {port!r} is wired to {ref!r}; wire it to another node's output port, "
                             f"e.g. node.out('trajectories')", node=name, port=port)
    if not isinstance(node.params, dict) or not all(isinstance(k, str) for k in node.params):
        raise GraphError(f"params {node.params!r} must be a dict of parameter name (a string) -> value", node=name)


def validate(graph) -> list:
    from rose.graph.ops import get_op

    if not isinstance(graph.nodes, dict):
        raise GraphError(f"graph.nodes must be a dict of name -> Node, got {type(graph.nodes).__name__}",
                         graph=_label(graph.name))
    for key, node in graph.nodes.items():
        check_node(node, key)
    ops = {}
    for node in graph.nodes.values():
        try:
            ops[node.name] = get_op(node.op)
        except KeyError as e:
            raise GraphError(str(e.args[0]), node=node.name, op=node.op) from None
    for node in graph.nodes.values():
        op = ops[node.name]
        for port, ref in node.inputs.items():
            if port not in op.inputs:
                raise GraphError(f"op {node.op!r} has no input port {port!r}; it has {sorted(op.inputs)}",
                                 node=node.name, port=port)
            src = graph.nodes.get(ref.node)
            if src is None:
                raise GraphError(f"input {port!r} is wired to unknown node {ref.node!r}", node=node.name, port=port)
            src_op = ops[src.name]
            if ref.port not in src_op.outputs:
                raise GraphError(f"input {port!r} is wired to {ref}, but op {src.op!r} has no output "
                                 f"{ref.port!r}; it has {sorted(src_op.outputs)}", node=node.name, port=port)
            want, got = op.inputs[port], src_op.outputs[ref.port]
            if not want.accepts(got):
                raise GraphError(f"port type mismatch: {ref} produces {got}, input {port!r} takes {want}",
                                 node=node.name, port=port)
        for port in op.inputs:
            if port not in node.inputs and port not in op.optional_inputs:
                raise GraphError(f"required input {port!r} is not wired", node=node.name, port=port)
        try:
            op.check_params(node.params)
        except Exception as e:  # TypeError/ValueError by contract; anything else from an op's own checks too
            raise GraphError(f"bad parameters for op {node.op!r}: {e}", node=node.name) from None
    return _topo_order(graph)


def validate_step(graph) -> list:
    """`validate`, plus the shape the runner drives: at least one rollout node, exactly one train node
    and exactly one sync node (reward nodes: any number, chained). Raises GraphError."""
    from rose.graph.ops import get_op

    order = validate(graph)
    by_phase: dict[str, list[str]] = {}
    for node in order:
        by_phase.setdefault(get_op(node.op).phase, []).append(node.name)
    if not by_phase.get("rollout"):
        raise GraphError("a step graph needs a rollout node", graph=_label(graph.name))
    for phase in ("train", "sync"):
        found = by_phase.get(phase, [])
        if len(found) != 1:
            raise GraphError(f"a step graph needs exactly one {phase} node, found {len(found)}: {found}",
                             graph=_label(graph.name), node=(found or [None])[-1])
    return order


def _topo_order(graph) -> list:
    # Kahn's algorithm; whatever is left when no node is ready lies on a cycle.
    indeg = {n: 0 for n in graph.nodes}
    users: dict[str, list[str]] = {n: [] for n in graph.nodes}
    for node in graph.nodes.values():
        for ref in node.inputs.values():
            indeg[node.name] += 1
            users[ref.node].append(node.name)
    ready = [n for n, d in indeg.items() if d == 0]
    order = []
    while ready:
        name = ready.pop(0)
        order.append(graph.nodes[name])
        for u in users[name]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    if len(order) != len(graph.nodes):
        stuck = sorted(n for n, d in indeg.items() if d > 0)
        raise GraphError(f"cycle among nodes {stuck}", node=stuck[0])
    return order
