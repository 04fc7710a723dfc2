"""ROSE: agentic RL post-training on a Dask cluster, borrowing spare capacity from serving GPUs.

    import rose
    report = rose.run("pipelines/guess.py", steps=20)   # starts a LocalRoseCluster
    report.metrics                                       # per-step pandas DataFrame
    report.plot("reward.png")
"""
import rose.ops  # noqa: F401  (registers the built-in ops for graphs built anywhere)
from rose.config import ClusterConfig, DAPOConfig, EngineConfig, GRPOConfig, ModelConfig
from rose.ops.reward_model import RewardModel
from rose.ops.reward_shapes import Reward, Rewards
from rose.pipeline import Pipeline, load_pipeline
from rose.report import Report

__all__ = ["ClusterConfig", "DAPOConfig", "EngineConfig", "GRPOConfig", "LocalRoseCluster", "ModelConfig", "Pipeline",
           "Report", "Reward", "RewardModel", "Rewards", "load_pipeline", "run"]


def run(*args, **kwargs):
    from rose.runner import run as _run

    return _run(*args, **kwargs)


run.__doc__ = "See rose.runner.run."


def __getattr__(name):
    if name == "LocalRoseCluster":  # imported lazily: it pulls in distributed's deploy machinery
        from rose.runtime.cluster import LocalRoseCluster

        return LocalRoseCluster
    raise AttributeError(name)
