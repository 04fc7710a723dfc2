"""The entropy bound of a weight change: the bytes a sync would need at the least, to compare with what it sends.

For one shard of n elements of which k changed (their integer bits differ), the bound is

    n * H2(k / n)  +  k * H(D)   bits,

where H2 is the binary entropy (which k of the n positions changed, at the observed density) and
H(D) the empirical entropy of the k differences new_bits - old_bits (as integers; each distinct
difference a symbol). It is the order-0 bound: what a lossless coding of the change needs when
positions are independent draws at density k/n and differences independent draws from their own
histogram, with that histogram and the counts known for free. A coding that models more
(differences by exponent, positions by row) could go below it; a coding that sends its tables pays
above it. The plug-in entropy of k values is at most log2 k bits each, so the bound stays below
the dense shard even where every element changed: a shard sent dense (most elements changed, or a
receiver without the base) still counts its entropy bound, and the ratio shows what sending it whole
costs. With no base at all (a receiver that holds nothing at that position) the bound is the shard.

    >>> old = np.zeros(8, np.uint16); new = old.copy(); new[[1, 5]] = [1, 2]
    >>> round(change_bound_bits(old.tobytes(), new.tobytes(), "bfloat16"), 2)  # 8 H2(1/4) + 2 H(1/2, 1/2)
    8.49
"""
from __future__ import annotations

import numpy as np

from rose.runtime.weights.shards import Manifest, uint_view


def binary_entropy_bits(n: int, k: int) -> float:
    """n * H2(k / n): bits to say which k of n positions are marked, at their density."""
    if k <= 0 or k >= n:
        return 0.0
    p = k / n
    return float(-n * (p * np.log2(p) + (1 - p) * np.log2(1 - p)))


def empirical_entropy_bits(symbols: np.ndarray) -> float:
    """len(symbols) * H(their histogram): sum over distinct symbols of c * log2(N / c)."""
    if symbols.size == 0:
        return 0.0
    counts = np.unique(symbols, return_counts=True)[1].astype(np.float64)
    return float((counts * np.log2(symbols.size / counts)).sum())


def change_bound_bits(base, new, dtype: str) -> float:
    """The order-0 entropy of the change from `base` to `new` (shard bytes of `dtype` elements), in bits."""
    a, b = uint_view(base, dtype), uint_view(new, dtype)
    if a.shape != b.shape:
        raise ValueError(f"shard sizes differ: {a.nbytes} vs {b.nbytes} bytes")
    idx = np.flatnonzero(a != b)
    diffs = b[idx].astype(np.int64) - a[idx].astype(np.int64)
    return binary_entropy_bits(a.size, idx.size) + empirical_entropy_bits(diffs)


def shard_bound_bytes(base, new, dtype: str) -> float:
    """Bound on the bytes that bring a holder of `base` to `new`: the entropy of the change; the dense
    size where there is no base (None) or it differs in size."""
    if base is None or len(base) != len(new):
        return float(len(new))
    return change_bound_bits(base, new, dtype) / 8


def version_bound_bytes(manifest: Manifest, prev: Manifest | None, get) -> float:
    """Bound on the bytes that bring one receiver holding `prev` to `manifest`: a sum over the shards
    it lacks, each counted once (as a sync sends it once per receiver), against the shard at the
    same position in `prev` (the base a delta would use). `get(hash)` returns a shard's bytes."""
    held = prev.hashes() if prev is not None else set()
    seen: set[str] = set()
    total = 0.0
    for s in manifest.shards:
        if s.hash in held or s.hash in seen:
            continue
        seen.add(s.hash)
        old = prev.at(s.position) if prev is not None else None
        total += shard_bound_bytes(get(old.hash) if old is not None else None, get(s.hash), s.dtype)
    return total
