"""Shards and manifests: a weight version as a list of hashed byte ranges.

A parameter (or, for tensor-parallel receivers, one slice of it) is cut into fixed-size byte ranges;
each range is hashed with xxh3-128. A version's manifest lists every shard with where it belongs, so
two versions (or two receivers) compare shard by shard without touching the bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import xxhash

from rose.errors import ConfigError

DEFAULT_SHARD_BYTES = 1 << 20  # 1 MiB: small enough that unchanged regions are skipped whole

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Unsigned integer views used to compare and copy elements bit for bit (bf16 has no numpy dtype).
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ConfigError(f"unsupported weight dtype {name!r}; choose one of {sorted(_DTYPES)}") from None


def itemsize(dtype: str) -> int:
    return torch.empty((), dtype=torch_dtype(dtype)).element_size()


def uint_view(buf, dtype: str) -> np.ndarray:
    """Bytes of `dtype` elements as unsigned integers of the same width (no copy)."""
    return np.frombuffer(buf, dtype=_UINT[itemsize(dtype)])


def shard_hash(data) -> str:
    return xxhash.xxh3_128_hexdigest(data)


@dataclass(frozen=True)
class TPSlice:
    """Which part of each parameter a tensor-parallel receiver holds: rank `rank` of `size`."""

    rank: int = 0
    size: int = 1

    def __post_init__(self):
        if not (self.size >= 1 and 0 <= self.rank < self.size):
            raise ConfigError(f"tensor-parallel slice rank={self.rank} size={self.size} is not valid")

    @property
    def label(self) -> str:
        return "" if self.size == 1 else f"tp{self.rank}of{self.size}"


FULL = TPSlice()


def tp_dim(name: str, ndim: int) -> int | None:
    """The dimension a Llama-style parameter is split along under tensor parallelism, None if replicated.

    Row-parallel layers (attention output, MLP down) split their input dimension; every other
    matrix (q/k/v, gate/up, embeddings, lm_head) splits its output dimension; vectors are replicated.
    """
    if ndim < 2:
        return None
    return 1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0


def take_slice(name: str, t: torch.Tensor, s: TPSlice) -> torch.Tensor:
    dim = tp_dim(name, t.dim())
    if s.size == 1 or dim is None:
        return t
    n = t.shape[dim]
    if n % s.size:
        raise ConfigError(f"parameter {name} of shape {tuple(t.shape)} does not split {s.size} ways on dim {dim}")
    step = n // s.size
    return t.narrow(dim, s.rank * step, step)


@dataclass(frozen=True)
class ShardRef:
    """One shard of a version. Shards of a parameter slice tile its bytes in offset order."""

    param: str  # parameter name as the engine loads it
    slice: str  # TPSlice.label; "" for the whole tensor (or a replicated one)
    offset: int  # bytes from the start of the parameter slice
    nbytes: int  # bytes in this shard
    dtype: str  # element type of the bytes, e.g. "bfloat16"
    shape: tuple[int, ...]  # shape of the whole parameter slice
    hash: str  # xxh3-128 of the bytes, hex

    @property
    def position(self) -> tuple[str, str, int]:
        return (self.param, self.slice, self.offset)


@dataclass(frozen=True)
class Manifest:
    version: int
    shards: tuple[ShardRef, ...]
    _by_position: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_by_position", {s.position: s for s in self.shards})

    def at(self, position) -> ShardRef | None:
        return self._by_position.get(position)

    def for_slices(self, labels) -> list[ShardRef]:
        labels = set(labels)
        return [s for s in self.shards if s.slice in labels or s.slice == ""]

    def hashes(self, labels=None) -> set[str]:
        return {s.hash for s in (self.shards if labels is None else self.for_slices(labels))}

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    def diff(self, old: Manifest | None) -> list[ShardRef]:
        """Shards of this version whose bytes differ from `old` at the same position (all if None)."""
        if old is None:
            return list(self.shards)
        return [s for s in self.shards if (o := old.at(s.position)) is None or o.hash != s.hash]


def shard_params(tensors: dict[str, torch.Tensor], version: int, dtype: str = "bfloat16",
                 shard_bytes: int = DEFAULT_SHARD_BYTES, slices=(FULL,)) -> tuple[Manifest, dict[str, memoryview]]:
    """Cut `tensors` (cast to `dtype`, on the CPU) into hashed shards.

    Returns the manifest and {hash: bytes}. A replicated parameter appears once, under slice "";
    a split one once per slice in `slices`. Identical shards share one hash and one buffer.
    """
    size = itemsize(dtype)
    if shard_bytes < size or shard_bytes % 8:
        raise ConfigError(f"shard_bytes={shard_bytes} must be a positive multiple of 8")
    td = torch_dtype(dtype)
    refs, data = [], {}
    for name in sorted(tensors):
        t = tensors[name].detach()
        parts = [(FULL, t)] if tp_dim(name, t.dim()) is None else [(s, take_slice(name, t, s)) for s in slices]
        for s, part in parts:
            # A copy, always: the store must not alias a live parameter that the optimizer updates in place.
            flat = part.to(device="cpu", dtype=td, copy=True).contiguous().reshape(-1)
            buf = memoryview(flat.view(torch.uint8).numpy()).cast("B")
            for off in range(0, len(buf), shard_bytes):
                chunk = buf[off:off + shard_bytes]
                h = shard_hash(chunk)
                data.setdefault(h, chunk)
                refs.append(ShardRef(name, s.label, off, len(chunk), dtype, tuple(part.shape), h))
            if len(buf) == 0:
                refs.append(ShardRef(name, s.label, 0, 0, dtype, tuple(part.shape), shard_hash(b"")))
                data.setdefault(shard_hash(b""), memoryview(b""))
    return Manifest(version, tuple(refs)), data


def assemble(manifest: Manifest, get, label: str = "") -> dict[str, torch.Tensor]:
    """Rebuild the parameters of one slice from shard bytes; `get(hash)` returns a shard's bytes."""
    out: dict[str, torch.Tensor] = {}
    by_param: dict[str, list[ShardRef]] = {}
    for s in manifest.shards:
        if s.slice in ("", label):
            by_param.setdefault(s.param, []).append(s)
    for name, shards in by_param.items():
        shards.sort(key=lambda s: s.offset)
        total = sum(s.nbytes for s in shards)
        buf = bytearray(total)
        for s in shards:
            buf[s.offset:s.offset + s.nbytes] = get(s.hash)
        t = torch.frombuffer(buf, dtype=torch_dtype(shards[0].dtype)) if total else torch.empty(0)
        out[name] = t.reshape(shards[0].shape)
    return out
