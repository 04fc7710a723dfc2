"""Reward functions for tests, importable by worker processes."""
import math


def nan_for_sample_one(batch):
    """Follows the contract in shape but returns NaN for every sample_id 1: a broken reward."""
    return [math.nan if s == 1 else 0.0 for s in batch.column("sample_id").to_pylist()]


def answered_truth(data_source, solution_str, ground_truth, extra_info=None):
    """verl's shape: 1 if the last action answers the episode's ground truth, a dict as verl allows."""
    answer = extra_info["actions"][-1].split() if extra_info["actions"] else []
    return {"score": float(answer[:1] == ["answer"] and answer[1:2] == [ground_truth]), "data_source": data_source}


def env_paid(completions, env_reward, **kwargs):
    """TRL's shape: what the environment paid, one per completion."""
    assert len(completions) == len(env_reward) and all(isinstance(c, str) for c in completions)
    return list(env_reward)


def flat_even_groups(batch):
    """Even groups score 1.0 for every sample (no signal); odd groups their sample id (they vary)."""
    groups, samples = batch.column("group_id").to_pylist(), batch.column("sample_id").to_pylist()
    return [1.0 if g % 2 == 0 else float(s) for g, s in zip(groups, samples)]
