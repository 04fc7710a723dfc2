"""A pipeline: its settings and the function that builds one RL step's graph.

Pipelines live in `pipelines/*.py` as plain Python and define `PIPELINE = Pipeline(...)`.
`load_pipeline(path)` imports such a file.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Callable

from rose.config import ClusterConfig, EngineConfig, ModelConfig
from rose.errors import ConfigError, config_check


@dataclass(frozen=True)
class Pipeline:
    """Example:

        PIPELINE = Pipeline(name="guess", env="guess", build=step_graph, steps=60)
        report = rose.run(PIPELINE, steps=2)
    """

    name: str  # shown in reports
    env: str  # environment the (tiny) model is warm-started on
    build: Callable  # step (int) -> rose.graph.Graph for that step
    steps: int = 10  # RL steps when the caller does not say
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # Weight versions a step's rollouts may lag the trainer: 0 synchronous; 1 asynchronous (step k+1's
    # rollouts run during step k's training, on the weights from before it). See rose.schedule.
    staleness: int = 0
    # The trainer writes a checkpoint every this many steps and after the last (0: never; a lost trainer
    # is then restored from the model's own weights). `rose run --resume RUN_DIR` continues from the
    # latest one. See rose.checkpoint.
    checkpoint_every: int = 10

    def __post_init__(self):
        config_check(callable(self.build), "Pipeline", "build", self.build, "a function step -> Graph")
        config_check(isinstance(self.steps, int) and self.steps >= 1, "Pipeline", "steps", self.steps, ">= 1")
        config_check(isinstance(self.checkpoint_every, int) and self.checkpoint_every >= 0, "Pipeline",
                     "checkpoint_every", self.checkpoint_every, "an int >= 0 (0: no checkpoints)")
        config_check(self.staleness in (0, 1) and isinstance(self.staleness, int), "Pipeline", "staleness",
                     self.staleness, "0 (synchronous) or 1 (rollouts overlap the previous step's training)")
        from rose.envs import env_class

        env_class(self.env)  # unknown environments fail here, with the list of known ones


def load_pipeline(path: str) -> Pipeline:
    """Import a pipeline file and return its `PIPELINE`."""
    if not os.path.isfile(path):
        raise ConfigError(f"pipeline file {path!r} does not exist")
    name = "rose_pipeline_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pipeline = getattr(module, "PIPELINE", None)
    if not isinstance(pipeline, Pipeline):
        raise ConfigError(f"pipeline file {path!r} defines no PIPELINE = rose.Pipeline(...)")
    return pipeline


def with_algorithm(pipeline: Pipeline, algorithm: str) -> Pipeline:
    """`pipeline` with every train node's config switched to `algorithm` ("grpo" or "dapo"); the
    fields the pipeline set stay, those it left to the algorithm take the new one's defaults."""
    from dataclasses import replace

    from rose.config import ALGORITHMS, GRPOConfig

    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm={algorithm!r} is not allowed: one of {ALGORITHMS}")
    build = pipeline.build

    def switched(step: int):
        graph = build(step)
        for node in graph.nodes.values():
            if node.op == "train":
                node.params = {**node.params, "grpo": replace(node.params.get("grpo", GRPOConfig()),
                                                              algorithm=algorithm)}
        return graph

    return replace(pipeline, build=switched)


def overridden(pipeline: Pipeline, algorithm: str | None = None, **fields) -> Pipeline:
    """`pipeline` with the fields given (None: keep the pipeline's), validated as on construction."""
    from dataclasses import replace

    pipeline = replace(pipeline, **{k: v for k, v in fields.items() if v is not None})
    return pipeline if algorithm is None else with_algorithm(pipeline, algorithm)


def past_the_decay(graph, steps: int) -> list[str]:
    """A message for each train node of `graph` whose learning-rate decay ends before a run of `steps`
    steps does (one update a step): its last steps would train at the decay's floor, which a pipeline
    that set the decay for fewer steps (`rose run --steps N`) did not mean. A shorter run, which ends
    before its decay does, is a trial run and gets none."""
    out = []
    for name, node in graph.nodes.items():
        cfg = node.params.get("grpo") if node.op == "train" else None
        end = cfg.lr_warmup_steps + cfg.lr_decay_steps if cfg is not None and cfg.lr_decay_steps else None
        if end is not None and end < steps - 1:
            out.append(f"train node {name!r}: the learning rate decays to its floor "
                       f"(lr_final_ratio={cfg.lr_final_ratio} x lr={cfg.lr}) by update {end}, and this run has "
                       f"{steps} steps: its last {steps - 1 - end} updates run at the floor. Set "
                       f"GRPOConfig(lr_decay_steps={steps - cfg.lr_warmup_steps}) to decay over the whole run.")
    return out
