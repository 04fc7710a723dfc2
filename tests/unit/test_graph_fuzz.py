"""Fuzzed pipeline graphs: whatever a pipeline builds, validation answers with a GraphError (or, while
building, a ConfigError) whose context names the node or the graph, never another exception.

Graphs come two ways: from scratch (random names, ops, wiring and parameters of any type), and as a
valid RL step graph with random damage (rewired ports, extra or missing ports, cycles, renamed or
duplicated nodes, parameters of the wrong type). Nodes are also assigned directly, not only through
`Graph.add`, because pipelines mutate the graphs they build (the tests do too).
"""
import pickle

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rose.config import GRPOConfig
from rose.errors import ConfigError, GraphError
from rose.graph import Graph, rl_step
from rose.graph.node import Node, PortRef

OPS = ["prompts", "rollout", "reward", "train", "sync"]
PORTS = ["specs", "trajectories", "result", "metrics", "status", "fn", ""]
NAMES = ["prompts", "rollout", "reward", "reward0", "train", "sync", "a", "b", ""]

junk = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**12), st.floats(allow_nan=True),
                 st.text(max_size=12), st.binary(max_size=4), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.just(GRPOConfig()),
                 st.just(len), st.just(object()), st.just(PortRef("a", "specs")))
hashable = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**12), st.text(max_size=12), st.binary(max_size=4),
                     st.just(PortRef("a", "specs")))
names = st.one_of(st.sampled_from(NAMES), st.text(max_size=6))
env_names = st.sampled_from(["guess", "calc", "nope", "", ":", "os:path", "no.such.module:X", "rose:Nope",
                             "tests.helpers.envs:RaisingEnv", "a:b:c", "\x00"])
port_refs = st.one_of(st.builds(PortRef, names, st.sampled_from(PORTS)),
                      st.builds(PortRef, junk, junk), junk)
params = st.dictionaries(st.one_of(st.sampled_from(["env", "env_kwargs", "num_groups", "group_size", "retries",
                                                    "fn", "grpo", "bogus"]), hashable),
                         st.one_of(junk, env_names), max_size=5)
ops = st.one_of(st.sampled_from(OPS), st.text(max_size=6), junk)


@st.composite
def scratch_graphs(draw):
    g = Graph(draw(st.one_of(st.text(max_size=5), junk)))
    for _ in range(draw(st.integers(0, 7))):
        name = draw(st.one_of(names, hashable))
        inputs = draw(st.one_of(st.dictionaries(st.one_of(st.sampled_from(PORTS), hashable), port_refs, max_size=3),
                                junk))
        node = Node(name, draw(ops), inputs, draw(st.one_of(params, junk)))
        key = name if draw(st.booleans()) else draw(st.one_of(names, hashable))  # a key that disagrees with the name
        g.nodes[key] = draw(st.one_of(st.just(node), junk)) if draw(st.integers(0, 9)) == 0 else node
    return g


DAMAGE = ["rewire", "extra_port", "drop_port", "cycle", "rename", "duplicate", "param", "drop_param", "drop_node",
          "op"]


@st.composite
def damaged_step_graphs(draw):
    g = rl_step("g", draw(env_names), draw(st.integers(1, 3)), draw(st.integers(1, 3)),
                reward=[None] * draw(st.integers(0, 2)))
    for how in draw(st.lists(st.sampled_from(DAMAGE), min_size=1, max_size=3)):
        if not g.nodes:
            break
        key = draw(st.sampled_from(sorted(g.nodes, key=repr)))
        victim = g.nodes[key]
        if how == "rewire" and victim.inputs:
            victim.inputs[draw(st.sampled_from(sorted(victim.inputs)))] = draw(port_refs)
        elif how == "extra_port":
            victim.inputs[draw(st.sampled_from(PORTS))] = draw(port_refs)
        elif how == "drop_port":
            victim.inputs.clear()
        elif how == "cycle":  # feed a node from one of its own descendants (or itself)
            src = draw(st.sampled_from(sorted(g.nodes, key=repr)))
            victim.inputs[draw(st.sampled_from(sorted(victim.inputs) or ["trajectories"]))] = \
                PortRef(src, draw(st.sampled_from(PORTS)))
        elif how == "rename":
            victim.name = draw(names)
        elif how == "duplicate":
            g.nodes[draw(names)] = victim
        elif how == "param":
            victim.params[draw(st.sampled_from(["env", "num_groups", "group_size", "retries", "fn", "grpo",
                                                "env_kwargs"]))] = draw(junk)
        elif how == "drop_param":
            victim.params.clear()
        elif how == "drop_node":
            del g.nodes[key]
        elif how == "op":
            victim.op = draw(ops)
    return g


def _check(g: Graph) -> None:
    for check in (g.validate, g.validate_step):
        try:
            check()
        except GraphError as e:  # anything else fails the test, with hypothesis's smallest example
            assert "node" in e.context or "graph" in e.context, e  # it says where
            assert e.message, e
            pickle.loads(pickle.dumps(e))  # and it crosses Dask


@given(scratch_graphs())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_graphs_from_scratch_only_ever_raise_graph_errors_naming_where(g):
    _check(g)


@given(damaged_step_graphs())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_damaged_step_graphs_only_ever_raise_graph_errors_naming_where(g):
    _check(g)


@given(st.one_of(names, hashable), ops, st.one_of(st.dictionaries(st.sampled_from(PORTS), port_refs, max_size=2), junk),
       params)
@settings(max_examples=300, deadline=None)
def test_building_a_graph_only_ever_raises_graph_or_config_errors(name, op, inputs, kwargs):
    g = rl_step("g", "guess", 1, 1)
    try:
        g.add(name, op, inputs, **{k: v for k, v in kwargs.items() if isinstance(k, str)})
    except (GraphError, ConfigError) as e:
        assert "node" in e.context or "graph" in e.context, e
        return
    _check(g)
