"""The RL step graph, written once: prompts -> rollout -> reward(s) -> train -> sync.

The shipped pipelines, the tests and the benchmarks build their step graphs here; a pipeline that
needs another shape writes its own with `Graph.add` (the same ops, wired differently).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from rose.graph.graph import Graph


def rl_step(name: str, env: str, num_groups: int, group_size: int, *, env_kwargs: dict | None = None,
            reward: Callable | dict | Sequence[Callable | None] | None = None, grpo=None,
            rollout_retries: int | None = None) -> Graph:
    """One RL step of GRPO on environment `env`: `num_groups` environment seeds, `group_size` samples each.

    `reward`: a reward function (batch in, floats out; or verl's or TRL's shape, see
    `rose.ops.reward_shapes`; None keeps the environment's reward), a dict {name: fn | (fn, weight)} or a
    `rose.Rewards` weighed into one reward, or a sequence of functions applied in a chain (nodes `reward0`,
    `reward1`, ...). `grpo`: a `GRPOConfig`
    (None: the defaults). `rollout_retries`: Dask retries of a rollout task (None: the op's default).

        g = rl_step("guess", "guess", num_groups=16, group_size=8, grpo=rose.GRPOConfig(lr=3e-4))
    """
    g = Graph(name)
    prompts = {"env": env, "num_groups": num_groups, "group_size": group_size}
    if env_kwargs:
        prompts["env_kwargs"] = dict(env_kwargs)
    specs = g.add("prompts", "prompts", **prompts)
    rollout = {} if rollout_retries is None else {"retries": rollout_retries}
    scored = g.add("rollout", "rollout", inputs={"specs": specs.out("specs")}, **rollout)
    chain = [(f"reward{i}", fn) for i, fn in enumerate(reward)] if isinstance(reward, Sequence) else \
        [("reward", reward)]
    for node, fn in chain:
        scored = g.add(node, "reward", inputs={"trajectories": scored.out("trajectories")}, fn=fn)
    train = g.add("train", "train", inputs={"trajectories": scored.out("trajectories")},
                  **({} if grpo is None else {"grpo": grpo}))
    g.add("sync", "sync", inputs={"result": train.out("result")})
    return g
