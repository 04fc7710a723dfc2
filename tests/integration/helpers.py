from dataclasses import replace

import rose
from rose.graph import Graph

FP32 = rose.EngineConfig(dtype="float32")


def small_pipeline(env: str, model_env: str | None = None, groups: int = 4, group_size: int = 4,
                   steps: int = 2, reward_fn=None, build_kwargs: dict | None = None, rollout_kwargs: dict | None = None,
                   **kwargs) -> rose.Pipeline:
    """An RL step graph like the shipped pipelines', smaller; `env` may be a 'module:Class' path."""

    def build(step):
        g = Graph(f"test-{env.rsplit(':', 1)[-1]}")
        specs = g.add("prompts", "prompts", env=env, num_groups=groups, group_size=group_size)
        traj = g.add("rollout", "rollout", inputs={"specs": specs.out("specs")}, **(rollout_kwargs or {}))
        scored = g.add("reward", "reward", inputs={"trajectories": traj.out("trajectories")}, fn=reward_fn)
        train = g.add("train", "train", inputs={"trajectories": scored.out("trajectories")}, **(build_kwargs or {}))
        g.add("sync", "sync", inputs={"result": train.out("result")})
        return g

    # float32 engines by default here: tests compare vLLM's log-probs with the trainer's exactly
    kwargs.setdefault("engine", FP32)
    return rose.Pipeline(name=f"test-{model_env or env}", env=model_env or env, build=build, steps=steps, **kwargs)


def with_steps(p: rose.Pipeline, steps: int) -> rose.Pipeline:
    return replace(p, steps=steps)
