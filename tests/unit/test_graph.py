"""Graph validation on hypothesis-generated graphs, valid and broken, and lowering."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose.errors import GraphError
from rose.graph import PHASES, Graph, LowerContext, Op, get_op, lower, register_op
from rose.graph import rl_step as rose_rl_step
from rose.graph.node import PortRef


def rl_step(name="g", num_groups=2, group_size=2, chain_rewards=1):
    # several reward stages in a chain (nodes reward0, reward1, ...) are valid too
    return rose_rl_step(name, "guess", num_groups, group_size, reward=[None] * chain_rewards)


graph_shapes = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3))


@given(graph_shapes)
@settings(max_examples=30, deadline=None)
def test_valid_graphs_validate_in_dependency_order(shape):
    g = rl_step("g", *shape)
    order = [n.name for n in g.validate()]
    assert order.index("prompts") < order.index("rollout") < order.index("train") < order.index("sync")
    assert len(order) == len(g.nodes)


BREAKS = ["unknown_op", "cycle", "missing_input", "type_mismatch", "dangling", "unknown_port", "bad_param",
          "unknown_output"]


def _break(g: Graph, how: str, victim: str) -> str:
    """Break graph `g` the way `how` says; returns the node name the error must name."""
    node = g.nodes[victim]
    if how == "unknown_op":
        node.op = "frobnicate"
        return victim
    if how == "cycle":
        # a second reward fed by train's downstream chain and feeding back: reward0 <- rewardX <- reward0
        x = g.add("loop", "reward", inputs={"trajectories": PortRef("reward0", "trajectories")})
        g.nodes["reward0"].inputs["trajectories"] = x.out("trajectories")
        return "loop|reward0"
    if how == "missing_input":
        g.nodes["train"].inputs.clear()
        return "train"
    if how == "type_mismatch":
        g.nodes["train"].inputs["trajectories"] = PortRef("prompts", "specs")
        return "train"
    if how == "dangling":
        g.nodes["sync"].inputs["result"] = PortRef("ghost", "result")
        return "sync"
    if how == "unknown_port":
        g.nodes["rollout"].inputs["extra"] = PortRef("prompts", "specs")
        return "rollout"
    if how == "bad_param":
        g.nodes["prompts"].params["num_groups"] = "many"
        return "prompts"
    if how == "unknown_output":
        g.nodes["sync"].inputs["result"] = PortRef("train", "weightz")
        return "sync"
    raise AssertionError(how)


@given(graph_shapes, st.sampled_from(BREAKS), st.sampled_from(["prompts", "rollout", "train", "sync"]))
@settings(max_examples=80, deadline=None)
def test_broken_graphs_raise_graph_error_naming_the_node(shape, how, victim):
    g = rl_step("g", *shape)
    expected = _break(g, how, victim)
    with pytest.raises(GraphError) as info:
        g.validate()
    assert info.value.context["node"] in expected.split("|")
    if how in ("missing_input", "type_mismatch", "dangling", "unknown_port", "unknown_output"):
        assert "port" in info.value.context


def test_error_messages_are_specific():
    g = rl_step()
    g.nodes["train"].inputs["trajectories"] = PortRef("prompts", "specs")
    with pytest.raises(GraphError, match=r"prompts.specs produces rollout_specs\[\].*takes trajectories\[\]"):
        g.validate()
    with pytest.raises(GraphError, match="duplicate node name"):
        rl_step().add("train", "train")
    g2 = rl_step()
    g2.nodes["prompts"].params["env"] = "nope"
    with pytest.raises(GraphError, match="unknown environment"):
        g2.validate()


def test_lowering_fans_out_and_annotates():
    g = rl_step("g", num_groups=3, group_size=2)
    ctx = LowerContext(step=4, weight_version=4, graph="g", rollout_workers=("tcp://a", "tcp://b"), seed=1)
    low = lower(g, ctx)
    rollouts = [t for t in low.tasks if t.key.startswith("rose-rollout-")]
    assert len(rollouts) == 3  # one task per GRPO group
    assert low.keys_of("rollout", "trajectories") == [t.key for t in rollouts]  # a group's task gives its rows
    assert all(t.args[2] is t.annotations for t in rollouts)  # what a shed group resumes with
    assert all(t.annotations["rose-width"] == 2 and t.annotations["rose-group"] == "g/4" for t in rollouts)
    ids = [s.trajectory_id for t in rollouts for s in t.args[0]]
    assert len(set(ids)) == 6 and "s4-g2-i1" in ids
    assert all(len({s.group_id for s in t.args[0]}) == 1 for t in rollouts)
    assert all(t.key.endswith(f"-s4-g{t.args[0][0].group_id}") and t.args[1] == t.key for t in rollouts)
    assert all(t.annotations["step"] == 4 for t in low.tasks)
    # rollouts run on version 4; the sync tasks install the version the train step makes
    assert all(t.annotations["weight_version"] == (5 if "-sync-" in t.key else 4) for t in low.tasks)
    assert all(t.annotations["rose-role"] == "rollout" for t in rollouts)
    (sync,) = [t for t in low.tasks if "-sync-" in t.key]
    assert sync.role == "trainer" and sync.args[1] == ("tcp://a", "tcp://b")  # drives the sync to both
    # keys and ids are deterministic: lowering again gives the same
    assert [t.key for t in lower(g, ctx).tasks] == [t.key for t in low.tasks]
    # a GRPO group shares its environment seed
    specs = low.outputs[("prompts", "specs")]
    by_group = {}
    for s in specs:
        by_group.setdefault(s.group_id, set()).add(s.env_seed)
    assert all(len(v) == 1 for v in by_group.values())


@given(st.integers(0, 3))
@settings(max_examples=8, deadline=None)
def test_step_graphs_with_any_reward_chain_pass_what_the_runner_checks(chain):
    g = rl_step("g", chain_rewards=chain)
    assert [n.name for n in g.validate_step()][-2:] == ["train", "sync"]
    low = lower(g, LowerContext(step=0, weight_version=0, graph="g"))
    # the runner groups tasks by their op's phase, whatever the nodes are called
    assert {t.phase for t in low.tasks} == {"rollout", "train", "sync"} | ({"reward"} if chain else set())
    assert all(t.phase == get_op(g.nodes[t.node].op).phase for t in low.tasks)
    # the step's trajectories are what its train node takes in: the last reward's (or the rollouts')
    assert low.input_keys(g.nodes["train"], "trajectories") == \
        low.keys_of(f"reward{chain - 1}" if chain else "rollout", "trajectories")


def test_step_validation_names_what_the_runner_needs():
    g = rl_step()
    g.add("train2", "train", inputs={"trajectories": PortRef("reward0", "trajectories")})
    g.validate()  # a valid graph ...
    with pytest.raises(GraphError, match=r"exactly one train node, found 2: \['train', 'train2'\]"):
        g.validate_step()  # ... but not one step the runner can drive
    g = rl_step()
    del g.nodes["sync"]
    with pytest.raises(GraphError, match="exactly one sync node, found 0"):
        g.validate_step()


def test_ops_declare_a_phase():
    assert all(get_op(name).phase in PHASES for name in ("prompts", "rollout", "reward", "train", "sync"))

    class NoPhase(Op):
        name = "no-phase"

    with pytest.raises(TypeError, match="declares phase None"):
        register_op(NoPhase)
    with pytest.raises(KeyError, match="unknown op 'no-phase'"):
        get_op("no-phase")
