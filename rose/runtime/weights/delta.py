"""Sparse deltas between two versions of one shard, bit-exact.

An RL step at a small learning rate changes few elements of a bf16 shard (most fp32 updates round
away), so a changed shard travels as (positions, new values) when that is smaller than the shard.
Elements are compared as unsigned integers of their width: bit-exact, NaN-safe, -0.0 != +0.0.
Positions are coded as gaps in LEB128 (one byte for gaps under 128): at a 1 % change rate that is
about 1 byte per changed element instead of 4 for a plain int32 index.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rose.runtime.weights.shards import itemsize, shard_hash, uint_view


@dataclass(frozen=True)
class Delta:
    base: str  # hash of the shard version this applies to
    target: str  # hash of the result
    positions: bytes  # LEB128 gaps between changed element indices
    values: bytes  # the changed elements' new bytes, in index order

    @property
    def nbytes(self) -> int:
        return len(self.positions) + len(self.values)


def varint_encode(v: np.ndarray) -> bytes:
    v = np.asarray(v, dtype=np.uint64)
    if v.size == 0:
        return b""
    nb = np.ones(v.size, np.int64)  # bytes per value
    for k in range(1, 10):
        nb += v >= np.uint64(1 << (7 * k))
    starts = np.cumsum(nb) - nb
    j = np.arange(int(nb.sum())) - np.repeat(starts, nb)  # byte number within its value
    byte = (np.repeat(v, nb) >> (7 * j).astype(np.uint64)) & np.uint64(0x7F)
    more = (j < np.repeat(nb - 1, nb)).astype(np.uint64) << np.uint64(7)
    return (byte | more).astype(np.uint8).tobytes()


def varint_decode(data: bytes) -> np.ndarray:
    b = np.frombuffer(data, np.uint8)
    if b.size == 0:
        return np.zeros(0, np.uint64)
    ends = np.flatnonzero(b < 0x80)
    if ends.size == 0 or ends[-1] != b.size - 1:
        raise ValueError("truncated varint stream")
    starts = np.concatenate(([0], ends[:-1] + 1))
    j = np.arange(b.size) - np.repeat(starts, ends - starts + 1)
    parts = (b & 0x7F).astype(np.uint64) << (7 * j).astype(np.uint64)
    return np.add.reduceat(parts, starts)


def changed_indices(base, new, dtype: str) -> np.ndarray:
    a, b = uint_view(base, dtype), uint_view(new, dtype)
    if a.shape != b.shape:
        raise ValueError(f"shard sizes differ: {a.nbytes} vs {b.nbytes} bytes")
    return np.flatnonzero(a != b)


def encode(base, new, dtype: str, base_hash: str, target_hash: str) -> Delta | None:
    """The delta from `base` to `new`, or None when sending `new` whole is no larger."""
    idx = changed_indices(base, new, dtype)
    values = uint_view(new, dtype)[idx].tobytes()
    if len(values) >= len(new):  # cannot win: skip the position coding
        return None
    positions = varint_encode(np.diff(idx, prepend=0))
    if len(positions) + len(values) >= len(new):
        return None
    return Delta(base_hash, target_hash, positions, values)


def apply(base, delta: Delta, dtype: str) -> bytearray:
    """Base bytes + delta -> new bytes. The caller verifies the result's hash (`verified_apply`)."""
    out = bytearray(base)
    idx = np.cumsum(varint_decode(delta.positions))
    vals = uint_view(delta.values, dtype)
    if idx.size != vals.size:
        raise ValueError(f"delta has {idx.size} positions and {vals.size} values")
    view = np.frombuffer(out, dtype=uint_view(b"", dtype).dtype)
    if idx.size and int(idx[-1]) >= view.size:
        raise ValueError(f"delta position {int(idx[-1])} beyond a shard of {view.size} elements")
    view[idx.astype(np.int64)] = vals
    return out


def verified_apply(base, delta: Delta, dtype: str) -> bytearray | None:
    """apply(), then check the target hash: None if the result is not the shard it claims to be."""
    try:
        out = apply(base, delta, dtype)
    except ValueError:
        return None
    return out if shard_hash(out) == delta.target else None


def changed_fraction(old: torch.Tensor, new: torch.Tensor) -> float:
    """Fraction of elements whose bits differ (on any device; the GPU path of the publisher)."""
    if old.shape != new.shape or old.dtype != new.dtype:
        raise ValueError(f"tensors differ in shape or dtype: {tuple(old.shape)} {old.dtype} vs "
                         f"{tuple(new.shape)} {new.dtype}")
    if old.numel() == 0:
        return 0.0
    iview = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[old.element_size()]
    return float((old.view(iview) != new.view(iview)).float().mean())


def sparse_diff(old: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat indices, new values) where `new` differs from `old` bit for bit, on their device."""
    iview = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[old.element_size()]
    idx = torch.nonzero(old.reshape(-1).view(iview) != new.reshape(-1).view(iview)).reshape(-1)
    return idx, new.reshape(-1)[idx]


__all__ = ["Delta", "encode", "apply", "verified_apply", "changed_fraction", "sparse_diff", "itemsize"]
