"""Long multi-turn conversations end to end: a six-turn test environment (`tests.helpers.envs:ChattyEnv`,
seven tokens a turn, contexts of 60-70 tokens), 16 groups of 8 a step, float32 engines, on a local
cluster with one dedicated rollout worker. Prints how many trajectories failed (expected: none), the
first error if any, and the per-step table. Recorded in benchmarks/RESULTS.md ("Long conversations").

    PYTHONPATH=. .venv/bin/python scripts/long_conversations.py [STEPS]      # default 60
"""
import sys

import rose
from rose.config import ClusterConfig
from tests.integration.helpers import FP32, small_pipeline


def main():
    from distributed import Client

    from rose.runtime.cluster import LocalRoseCluster

    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    p = small_pipeline("tests.helpers.envs:ChattyEnv", model_env="guess", groups=16, group_size=8, steps=steps)
    with LocalRoseCluster(ClusterConfig(num_dedicated=1), FP32) as c, Client(c) as client:
        r = rose.run(p, cluster=client, progress=False)
    reasons = r.trajectories["finish_reason"].to_pylist()
    print("failed", reasons.count("failed"), "of", len(reasons))
    print([e for e in r.trajectories["error"].to_pylist() if e][:1])
    print(r.metrics[["step", "failed", "reward_mean", "tokens"]].to_string())


if __name__ == "__main__":
    main()
