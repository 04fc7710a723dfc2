"""`RewardModel`: a reward function whose scores come from a reward worker's model
(`dask worker ... --preload rose.worker --rose-role reward --rose-reward-model DIR`, or
`ClusterConfig(num_reward=1, reward_model=DIR)`). The reward op places the tasks that call it on
reward workers; there it scores each trajectory's text, the prompt followed by the conversation
(`rose.ops.reward_shapes.response`), in batches.

    g = rl_step("calc", "calc", 16, 8, reward={"judge": rose.RewardModel(), "correct": (compute_score, 1.0)})
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from rose.ops.reward_shapes import Reward, Rewards, response


@dataclass(frozen=True)
class RewardModel:
    """Scores from the reward worker's sequence-classification model (its one logit), one per trajectory."""

    scale: float = 1.0  # multiplies the model's score
    __name__ = "reward_model"  # the name its failures and its term go by

    def __call__(self, batch: pa.RecordBatch) -> list[float]:
        from rose.runtime.worker.plugin import rose_worker
        from rose.runtime.worker.reward_host import RewardHost

        w = rose_worker()
        if not isinstance(w.host, RewardHost):
            raise RuntimeError(f"rose.RewardModel runs on a reward worker; worker {w.address} has role {w.role!r}")
        texts = [p + response(a, o) for p, a, o in zip(batch.column("prompt").to_pylist(),
                                                        batch.column("actions").to_pylist(),
                                                        batch.column("observations").to_pylist())]
        return [self.scale * s for s in w.host.score(texts)]


def needs_reward_worker(fn) -> bool:
    """Whether the reward op's `fn` (a function, a Reward, a Rewards or a dict of terms) calls a RewardModel."""
    if isinstance(fn, dict):
        return any(needs_reward_worker(v[0] if isinstance(v, tuple) else v) for v in fn.values())
    if isinstance(fn, Rewards):
        return any(needs_reward_worker(t) for t in fn.terms)
    if isinstance(fn, Reward):
        return needs_reward_worker(fn.fn)
    return isinstance(fn, RewardModel)
