"""Reward functions for tests, importable by worker processes."""
import math


def nan_for_sample_one(batch):
    """Follows the contract in shape but returns NaN for every sample_id 1: a broken reward."""
    return [math.nan if s == 1 else 0.0 for s in batch.column("sample_id").to_pylist()]
