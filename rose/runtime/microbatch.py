"""Micro-batches by token budget: the trainer's forward and backward passes run on slices of the batch
whose padded size stays under a budget, so peak activation memory stays flat as a step's batch grows.

A slice costs (rows x its longest row) tokens of activations, padding included. Rows are taken
longest first and packed greedily: rows of similar length share a slice, which keeps padding low.
A row longer than the budget gets a slice of its own (it cannot be split: its tokens attend to each
other). Pure: the trainer calls it with the rows' lengths.
"""
from __future__ import annotations

import numpy as np


def plan_microbatches(lengths: np.ndarray, max_tokens: int | None) -> list[np.ndarray]:
    """Row indices of each micro-batch (every row exactly once). `lengths`: (B,) tokens per row.
    `max_tokens`: padded tokens per micro-batch at most (None: the whole batch in one)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 or None, got {max_tokens}")
    if max_tokens is None or len(lengths) == 0:
        return [np.arange(len(lengths))]
    order = np.argsort(-lengths, kind="stable")  # longest first: each slice's first row sets its width
    batches, current = [], []
    for i in order:
        width = int(lengths[current[0]]) if current else int(lengths[i])
        if current and (len(current) + 1) * width > max_tokens:
            batches.append(np.array(current))
            current = []
        current.append(int(i))
    batches.append(np.array(current))
    return batches
