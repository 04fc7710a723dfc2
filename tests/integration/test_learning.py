"""Seeded learning test: GRPO on the default `guess` pipeline raises the reward in a few minutes."""
import pytest

import rose
from rose.pipeline import load_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 30  # ~7 s a step here


def test_guess_reward_rises(cluster):
    p = load_pipeline("pipelines/guess.py")
    report = rose.run(p, cluster=cluster, steps=STEPS, seed=0, progress=False)
    m = report.metrics
    assert report.lost == 0 and report.duplicated == 0
    first = m["reward_mean"].head(5).mean()
    # the last third of the run, not just five steps: a step's mean reward is noisy (about ±0.04)
    last = m["reward_mean"].tail(STEPS // 3).mean()
    assert last > first, m["reward_mean"].round(3).tolist()
