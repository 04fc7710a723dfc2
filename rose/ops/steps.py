"""The RL step's ops: prompts -> rollout -> reward -> train -> sync, with their typed ports."""
from __future__ import annotations

import json
import zlib
from collections.abc import Callable

from rose.config import GRPOConfig
from rose.graph.lower import Ref, TaskSpec, task_key
from rose.graph.node import PortType
from rose.graph.ops import Op, register_op
from rose.ops.reward import apply_reward
from rose.ops.reward_model import needs_reward_worker
from rose.ops.reward_shapes import Reward, Rewards, shape_of
from rose.ops.rollout import RolloutSpec, run_rollout
from rose.ops.train import sync_weights, train_metrics, train_step
from rose.runtime.protocol import ROLLOUT_KEY_PREFIX, Annotation
from rose.runtime.trajectory import TRAJECTORY_SCHEMA

SPECS = PortType("rollout_specs", partitioned=True)
TRAJECTORIES = PortType("trajectories", schema=TRAJECTORY_SCHEMA, partitioned=True)
TRAIN_RESULT = PortType("train_result")
METRICS = PortType("metrics")
SYNC_STATUS = PortType("sync_status", partitioned=True)


@register_op
class PromptsOp(Op):
    """Driver-side source: G samples for each of `num_groups` environment seeds (no task). Groups are
    numbered from `first_group` (0; dynamic sampling's later rounds go on from where the step stopped)."""

    name = "prompts"
    phase = "rollout"
    outputs = {"specs": SPECS}
    params = {"env": str, "env_kwargs": dict, "num_groups": int, "group_size": int, "first_group": int}
    required_params = frozenset({"env", "num_groups", "group_size"})

    def check_params(self, params):
        super().check_params(params)
        from rose.envs import env_class

        env_class(params["env"])  # unknown environment -> ConfigError (a ValueError)
        try:  # each trajectory records them as JSON, for a replay of its environment
            json.dumps(params.get("env_kwargs", {}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"env_kwargs={params['env_kwargs']!r} must be JSON values: {e}") from None
        for k in ("num_groups", "group_size"):
            if params[k] < 1:
                raise ValueError(f"{k}={params[k]} must be >= 1")
        if params.get("first_group", 0) < 0:
            raise ValueError(f"first_group={params['first_group']} must be >= 0")

    def lower(self, node, ctx, inputs):
        p = node.params
        seed = ctx.seed
        specs = []
        first = p.get("first_group", 0)
        for g in range(first, first + p["num_groups"]):
            env_seed = zlib.crc32(f"{seed}/{ctx.step}/{g}".encode())
            for i in range(p["group_size"]):
                specs.append(RolloutSpec(ctx.step, g, i, p["env"], env_seed, dict(p.get("env_kwargs", {})),
                                         ctx.temperature, ctx.top_p, seed, ctx.request_timeout_s,
                                         ctx.env_timeout_s))
        return [], {"specs": specs}


@register_op
class RolloutOp(Op):
    """One task per GRPO group on a rollout worker, placed by the scheduler's ROSE plugin; a group shed
    from its worker resumes elsewhere and its task returns when the whole group is done (`run_rollout`);
    retried with the same key and trajectory ids."""

    name = "rollout"
    phase = "rollout"
    inputs = {"specs": SPECS}
    outputs = {"trajectories": TRAJECTORIES}
    params = {"retries": int}

    def lower(self, node, ctx, inputs):
        groups: dict[int, list[RolloutSpec]] = {}
        for spec in inputs["specs"]:
            groups.setdefault(spec.group_id, []).append(spec)
        tasks = []
        for group_id, specs in groups.items():
            key = ROLLOUT_KEY_PREFIX + task_key(ctx, node, f"g{group_id}")
            # What the placement plugin reads: rollout tasks, their width in sequences, the weight version
            # their engine must hold (synchronous mode: this step's), and the fairness group.
            annotations = {Annotation.ROLE: "rollout", Annotation.WIDTH: len(specs),
                           Annotation.VERSION: ctx.weight_version, Annotation.GROUP: f"{ctx.graph}/{ctx.step}"}
            tasks.append(TaskSpec(key, run_rollout, (tuple(specs), key, annotations), role="rollout",
                                  retries=node.params.get("retries", 2), annotations=annotations))
        return tasks, {"trajectories": [Ref(t.key) for t in tasks]}


@register_op
class RewardOp(Op):
    """One task per trajectory partition; `fn` is a reward function of any shape `rose.ops.reward_shapes`
    knows, a `Reward` or a `Rewards` (None: the environment's reward)."""

    name = "reward"
    phase = "reward"
    inputs = {"trajectories": TRAJECTORIES}
    outputs = {"trajectories": TRAJECTORIES}
    params = {"fn": (Callable, Reward, Rewards, dict, type(None))}

    def check_params(self, params):
        super().check_params(params)
        fn = params.get("fn")
        if isinstance(fn, dict):
            Rewards.of(fn)  # a bad term fails here, at the graph, not on a worker
        elif callable(fn) and not isinstance(fn, (Reward, Rewards)):
            shape_of(fn)  # so does a function of no known shape

    def lower(self, node, ctx, inputs):
        fn = node.params.get("fn")
        role = "reward" if needs_reward_worker(fn) else None  # a RewardModel scores on a reward worker
        tasks, outs = [], []
        for i, ref in enumerate(inputs["trajectories"]):
            key = task_key(ctx, node, i)
            tasks.append(TaskSpec(key, apply_reward, (ref, fn), role=role))
            outs.append(Ref(key))
        return tasks, {"trajectories": outs}


@register_op
class TrainOp(Op):
    """One GRPO update on the trainer worker over all trajectories of the step."""

    name = "train"
    phase = "train"
    inputs = {"trajectories": TRAJECTORIES}
    outputs = {"result": TRAIN_RESULT, "metrics": METRICS}
    params = {"grpo": GRPOConfig}

    def lower(self, node, ctx, inputs):
        cfg = node.params.get("grpo", GRPOConfig())
        key = task_key(ctx, node)
        # The placement plugin keeps rollouts off workers colocated with the trainer while it runs.
        train = TaskSpec(key, train_step, (cfg, *inputs["trajectories"]), role="trainer",
                         annotations={Annotation.TRAINS: True})
        metrics = TaskSpec(f"{key}-metrics", train_metrics, (Ref(key),), role="trainer")
        return [train, metrics], {"result": [Ref(key)], "metrics": [Ref(metrics.key)]}


@register_op
class SyncOp(Op):
    """Weight sync after the train step: one task on the trainer that plans and drives the transfer
    to every rollout worker (`rose.runtime.weights`); its status lists each worker's new version."""

    name = "sync"
    phase = "sync"
    inputs = {"result": TRAIN_RESULT}
    outputs = {"status": SYNC_STATUS}

    def lower(self, node, ctx, inputs):
        (result,) = inputs["result"]
        key = task_key(ctx, node)
        task = TaskSpec(key, sync_weights, (result, tuple(ctx.rollout_workers)), role="trainer",
                        annotations={Annotation.VERSION: ctx.weight_version + 1})
        return [task], {"status": [Ref(key)]}
