"""Sparse deltas between two versions of one shard, bit-exact.

An RL step at a small learning rate changes few elements of a bf16 shard (most fp32 updates round
away), so a changed shard travels as (positions, changes) when that is smaller than the shard.
Elements are compared as unsigned integers of their width: bit-exact, NaN-safe, -0.0 != +0.0.
Why this coding: positions go as gaps (small numbers where changes are sparse) and each change as
the difference of the element's integer bits, which for a float nudged by a small update is a step
of one or two units in the last place: one byte per gap (`gaps_encode`) and the narrowest integer
width that holds every difference (int8 up to int64), then zstd. About one byte per changed element in all, against
2 bytes per element for the dense shard and 6 for a plain (int32 index, bf16 value) pair; decoding
is a cumulative sum and one scatter, so a receiver applies a 1 MiB shard in well under a millisecond.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from rose.runtime.weights.shards import shard_hash, uint_view

_ZSTD = pa.Codec("zstd", compression_level=1)


@dataclass(frozen=True)
class Delta:
    base: str  # hash of the shard version this applies to
    target: str  # hash of the result
    positions: bytes  # zstd(gaps_encode(changed element indices))
    values: bytes  # zstd(new bits - old bits, per changed element in index order, int8/16/32)
    raw_sizes: tuple[int, int]  # byte lengths of the two streams before compression

    @property
    def nbytes(self) -> int:
        return len(self.positions) + len(self.values) + 16  # + the two sizes

    def to_wire(self) -> dict:
        return {"base": self.base, "positions": self.positions, "values": self.values, "sizes": list(self.raw_sizes)}

    @classmethod
    def from_wire(cls, target: str, d: dict) -> "Delta":
        return cls(d["base"], target, d["positions"], d["values"], tuple(d["sizes"]))


def gaps_encode(idx: np.ndarray) -> bytes:
    """Sorted element indices -> one byte per gap; a gap of 255 or more is written as runs of 255
    (each adding 255) ending in a byte below 255. Decoding is then one cumulative sum."""
    gaps = np.diff(np.asarray(idx, dtype=np.int64), prepend=0)
    runs = gaps // 255
    out = np.full(int((runs + 1).sum()), 255, np.uint8)
    out[np.cumsum(runs + 1) - 1] = gaps % 255
    return out.tobytes()


def gaps_decode(data: bytes) -> np.ndarray:
    b = np.frombuffer(data, np.uint8)
    if b.size and b[-1] == 255:
        raise ValueError("truncated position stream")
    return np.cumsum(b, dtype=np.int64)[b != 255]


def _narrowest(d: np.ndarray) -> np.ndarray:
    for t in (np.int8, np.int16, np.int32):
        if d.size == 0 or (d.min() >= np.iinfo(t).min and d.max() <= np.iinfo(t).max):
            return d.astype(t)
    return d


def changed_indices(base, new, dtype: str) -> np.ndarray:
    a, b = uint_view(base, dtype), uint_view(new, dtype)
    if a.shape != b.shape:
        raise ValueError(f"shard sizes differ: {a.nbytes} vs {b.nbytes} bytes")
    return np.flatnonzero(a != b)


def encode(base, new, dtype: str, base_hash: str, target_hash: str) -> Delta | None:
    """The delta from `base` to `new`, or None when sending `new` whole is no larger."""
    idx = changed_indices(base, new, dtype)
    if idx.size * 2 >= uint_view(new, dtype).size:  # over half the elements changed: dense wins
        return None
    old_bits = uint_view(base, dtype)[idx].astype(np.int64)
    new_bits = uint_view(new, dtype)[idx].astype(np.int64)
    raw_pos = gaps_encode(idx)
    raw_val = _narrowest(new_bits - old_bits).tobytes()
    d = Delta(base_hash, target_hash, _ZSTD.compress(raw_pos, asbytes=True), _ZSTD.compress(raw_val, asbytes=True),
              (len(raw_pos), len(raw_val)))
    return d if d.nbytes < len(new) else None


def apply(base, delta: Delta, dtype: str, out=None):
    """Base bytes + delta -> new bytes, written into `out` (a writable buffer of the base's size) or a
    new bytearray. The caller verifies the result's hash (`verified_apply`)."""
    try:
        raw_pos = _ZSTD.decompress(delta.positions, decompressed_size=delta.raw_sizes[0], asbytes=True)
        raw_val = _ZSTD.decompress(delta.values, decompressed_size=delta.raw_sizes[1], asbytes=True)
    except (OSError, pa.ArrowException) as e:
        raise ValueError(f"delta streams do not decompress: {e}") from None
    if out is None:
        out = bytearray(base)
    else:
        if len(out) != len(base):
            raise ValueError(f"output buffer of {len(out)} bytes for a shard of {len(base)}")
        memoryview(out).cast("B")[:] = memoryview(base).cast("B")
    idx = gaps_decode(raw_pos)
    width = len(raw_val) // idx.size if idx.size else 1
    if width not in (1, 2, 4, 8) or width * idx.size != len(raw_val):
        raise ValueError(f"delta has {idx.size} positions and {len(raw_val)} bytes of changes")
    diffs = np.frombuffer(raw_val, {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[width])
    view = np.frombuffer(out, dtype=uint_view(b"", dtype).dtype)
    if idx.size and int(idx[-1]) >= view.size:
        raise ValueError(f"delta position {int(idx[-1])} beyond a shard of {view.size} elements")
    # Unsigned addition wraps modulo the element width: adding a difference cast to the same
    # width is exact two's-complement arithmetic.
    view[idx] += diffs.astype(view.dtype)
    return out


def verified_apply(base, delta: Delta, dtype: str, out=None):
    """apply(), then check the target hash: None if the result is not the shard it claims to be."""
    try:
        out = apply(base, delta, dtype, out)
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

