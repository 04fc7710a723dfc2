import json
import os
import subprocess
import sys
from dataclasses import replace

import rose
from rose.graph import rl_step

FP32 = rose.EngineConfig(dtype="float32")


def small_pipeline(env: str, model_env: str | None = None, groups: int = 4, group_size: int = 4,
                   steps: int = 2, reward_fn=None, build_kwargs: dict | None = None,
                   **kwargs) -> rose.Pipeline:
    """An RL step graph like the shipped pipelines', smaller; `env` may be a 'module:Class' path."""

    # float32 engines and trainer passes by default here: tests compare vLLM's log-probs with the
    # trainer's exactly (bf16 passes, GRPOConfig's "auto" on a CPU with AVX512-BF16, differ by ~2e-3)
    kwargs.setdefault("engine", FP32)
    build_kwargs = dict(build_kwargs or {})
    grpo = build_kwargs.get("grpo") or rose.GRPOConfig()
    if grpo.compute_dtype == "auto":
        build_kwargs["grpo"] = replace(grpo, compute_dtype="float32")

    def build(step):
        return rl_step(f"test-{env.rsplit(':', 1)[-1]}", env, groups, group_size, reward=reward_fn, **build_kwargs)

    return rose.Pipeline(name=f"test-{model_env or env}", env=model_env or env, build=build, steps=steps, **kwargs)


def with_steps(p: rose.Pipeline, steps: int) -> rose.Pipeline:
    return replace(p, steps=steps)


def run_engine_helper(script: str) -> dict:
    """Run tests/helpers/`script` in its own process (a real vLLM engine in a process of its own) on the
    guess model; returns the JSON of its last output line."""
    from rose.envs import env_class
    from rose.models import prepare_model

    model_dir = prepare_model(rose.ModelConfig(), env_class("guess"), progress=False)
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "helpers", script), model_dir],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
