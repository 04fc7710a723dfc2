"""Which rank of a sharded trainer publishes which shard, and which bytes the ranks pass each other for it.

FSDP2 splits every parameter along dim 0 as `torch.chunk` does: rows in chunks of ceil(n / world), rank
r takes chunk r (empty past the end). In row-major order a chunk of rows is one contiguous byte range of
the whole parameter, so rank r holds bytes [start_r, end_r) of it. A version's shards are cut from the
whole parameter at multiples of `shard_bytes`, exactly as one trainer cuts them (`shard_params`), so the
manifest is the same whatever the number of ranks. A shard belongs to the rank that holds most of its
bytes (a tie, e.g. a parameter of one shard split evenly, goes by a hash of the parameter's name, so such
parameters spread over the ranks instead of all landing on rank 0); the rest of its bytes are sent to it
by the ranks that hold them: per parameter at most one shard's worth per rank boundary, never the whole
model onto one rank. Owners never decrease with the offset, so each rank's shards of a parameter are one
contiguous range. Pure functions of the shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Layout:
    """One parameter's bytes over the ranks."""

    nbytes: int  # bytes of the whole parameter (in the published dtype)
    regions: tuple[tuple[int, int], ...]  # per rank: [start, end) bytes of the whole parameter it holds
    shard_bytes: int  # the manifest's shard size
    salt: int = 0  # breaks ties between ranks holding equal parts of a shard (a stable hash of the name)

    def shards(self) -> list[tuple[int, int]]:
        """(offset, nbytes) of every shard of the parameter, as `shard_params` cuts them."""
        if self.nbytes == 0:
            return [(0, 0)]
        return [(o, min(self.shard_bytes, self.nbytes - o)) for o in range(0, self.nbytes, self.shard_bytes)]

    def owner(self, offset: int) -> int:
        """The rank that publishes the shard at `offset`: the one holding most of its bytes, ties broken
        by `salt` (an empty parameter's one shard: rank 0)."""
        if self.nbytes == 0:
            return 0
        if not 0 <= offset < self.nbytes:
            raise ValueError(f"offset {offset} lies outside the {self.nbytes} bytes of the parameter")
        end = min(offset + self.shard_bytes, self.nbytes)
        held = [max(0, min(end, b) - max(offset, a)) for a, b in self.regions]
        most = [r for r, n in enumerate(held) if n == max(held)]
        return most[self.salt % len(most)]

    @cached_property
    def _owners(self) -> list[int]:
        """The owner of each shard, in offset order (computed once: publishing asks per rank and per pair)."""
        return [self.owner(o) for o, _ in self.shards()]

    def owned(self, rank: int) -> list[tuple[int, int]]:
        return [s for s, r in zip(self.shards(), self._owners) if r == rank]

    def span(self, rank: int) -> tuple[int, int]:
        """[lo, hi) bytes covered by `rank`'s shards (lo == hi: it publishes none of this parameter)."""
        mine = self.owned(rank)
        return (mine[0][0], mine[-1][0] + mine[-1][1]) if mine else (0, 0)

    def transfers(self) -> list[tuple[int, int, int, int]]:
        """(src, dst, lo, hi): bytes [lo, hi) of the parameter that rank src holds and rank dst needs for
        its shards, src != dst, in (dst, lo) order."""
        out = []
        for dst in range(len(self.regions)):
            lo, hi = self.span(dst)
            for src, (start, end) in enumerate(self.regions):
                a, b = max(lo, start), min(hi, end)
                if src != dst and a < b:
                    out.append((src, dst, a, b))
        return out


def dim0_layout(shape: tuple[int, ...], itemsize: int, world: int, shard_bytes: int, salt: int = 0) -> Layout:
    """A parameter split on dim 0 as FSDP2 splits it (`torch.chunk`), over `world` ranks."""
    if world < 1 or shard_bytes < 1:
        raise ValueError(f"world={world} and shard_bytes={shard_bytes} must be positive")
    rows = shape[0] if shape else 1
    row_bytes = itemsize
    for d in shape[1:]:
        row_bytes *= d
    chunk = -(-rows // world)  # ceil
    regions = tuple((min(r * chunk, rows) * row_bytes, min((r + 1) * chunk, rows) * row_bytes) for r in range(world))
    return Layout(rows * row_bytes, regions, shard_bytes, salt)


def whole_on_rank0(nbytes: int, world: int, shard_bytes: int) -> Layout:
    """A parameter every rank holds whole (not sharded): rank 0 publishes it (its bytes, the others none)."""
    return Layout(nbytes, ((0, nbytes),) + ((nbytes, nbytes),) * (world - 1), shard_bytes)
