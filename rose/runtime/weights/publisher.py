"""The trainer's side of publishing a version: shards cut and hashed from the weights where they live.

One trainer, or each rank of a sharded one (FSDP2 DTensors, `ownership.py`), publishes the shards it
owns: a rank's shards are cut from the rows it holds, the rest of a shard that runs into other ranks'
rows comes from them point to point (at most a shard per parameter and rank boundary), and the version's
manifest is the union of the ranks' parts, the same manifest one trainer would publish.

On a CUDA device the weights are cast to the published dtype there and compared with the previous
version's bytes, kept there (this rank's part in the published dtype: in bf16, 2 bytes a parameter over
the ranks, e.g. 1.75 GiB a GPU for a 7B model on 8). An unchanged shard keeps its hash and never leaves
the device; a changed one sends the host only its changed elements' positions and values (when under
half changed), and the host rebuilds its bytes from the previous version's to hash them, with the delta
receivers get encoded from the same arrays. The host then receives about what the sync sends. On the
CPU (or where a shard has no previous version) each shard is copied and hashed whole, and deltas are
encoded from the bytes (`WeightEndpoint.hold`).
"""
from __future__ import annotations

import zlib

import numpy as np
import torch

from rose.runtime.sharding import world_and_rank
from rose.runtime.weights import delta as deltas
from rose.runtime.weights.ownership import Layout, dim0_layout, whole_on_rank0
from rose.runtime.weights.shards import Manifest, ShardRef, itemsize, shard_hash, torch_dtype

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}  # same-width integer views for bitwise comparing


class RankPublisher:
    """This rank's part of every version the trainer publishes. `on_device`: keep the previous version on
    the weights' device and diff there (the default on CUDA; settable on the CPU, for tests)."""

    def __init__(self, dtype: str, shard_bytes: int, on_device: bool | None = None):
        self.dtype, self.shard_bytes = dtype, shard_bytes
        self.on_device = on_device
        self._prev: dict[str, tuple[int, torch.Tensor]] = {}  # name -> (span lo, the span's bytes on device)
        self._prev_refs: dict[tuple[str, int], ShardRef] = {}  # (name, offset) -> the shard published last
        self.host_bytes = 0  # bytes copied from the device to the host by the last `part`
        self._fresh: set[str] = set()  # names whose cast made a buffer of its own (no live weight behind it)

    def part(self, state: dict[str, torch.Tensor], version: int, base_bytes) -> tuple[Manifest, dict, dict]:
        """(this rank's shards as a manifest, {hash: bytes} of those not published before, {(base, target):
        Delta, or None where sending the shard whole is no larger} encoded from the device's arrays).
        `state`: every weight by name (DTensors sharded on dim 0 under FSDP2, or whole); `base_bytes(hash)`:
        the bytes of a shard this rank published last. A collective with a process group: every rank
        calls it with the same names."""
        world, rank = world_and_rank()
        names = sorted(state)
        layouts, locals_ = {}, {}
        self._fresh = set()
        for name in names:
            layouts[name], locals_[name] = self._local(name, state[name], world)
        received = _exchange(layouts, locals_, rank, world)
        refs, data, encoded = [], {}, {}
        self.host_bytes = 0
        prev_refs, self._prev_refs, prev_spans = self._prev_refs, {}, self._prev
        self._prev = {}
        for name in names:
            lay = layouts[name]
            lo, _ = lay.span(rank)
            shape = tuple(state[name].shape)
            if not lay.owned(rank):
                continue
            span = _span(lay, rank, locals_[name], received.get(name, []), name in self._fresh)
            keep = self.on_device if self.on_device is not None else span.device.type == "cuda"
            old = prev_spans.get(name) if keep else None
            host = None if keep else span.cpu()  # span is this call's own buffer: no copy on the CPU
            if host is not None:
                self.host_bytes += host.numel()
            for off, n in lay.owned(rank):
                before = prev_refs.get((name, off))
                if host is not None:
                    ref, chunk = self._whole(name, shape, off, n, host[off - lo:off - lo + n])
                else:
                    was = old[1][off - lo:off - lo + n] if old and old[0] == lo else None
                    ref, chunk = self._diffed(name, shape, off, n, span[off - lo:off - lo + n], before, was,
                                              base_bytes, encoded)
                refs.append(ref)
                self._prev_refs[(name, off)] = ref
                if chunk is not None:
                    data.setdefault(ref.hash, chunk)
            if keep:
                self._prev[name] = (lo, span)
        return Manifest(version, tuple(refs)), data, encoded

    def _local(self, name: str, t: torch.Tensor, world: int) -> tuple[Layout, torch.Tensor]:
        """The layout of `name` over the ranks and this rank's bytes of it (published dtype, flat, on its device)."""
        size = itemsize(self.dtype)
        local = t.detach()
        if hasattr(local, "to_local"):
            from torch.distributed.tensor import Shard

            if tuple(local.placements) != (Shard(0),) or local.device_mesh.size() != world:
                raise ValueError(f"cannot publish {name}: sharded as {local.placements} over "
                                 f"{local.device_mesh.size()} ranks; expected Shard(0) over {world}")
            lay = dim0_layout(tuple(local.shape), size, world, self.shard_bytes, zlib.crc32(name.encode()))
            local = local.to_local()
        else:  # every rank holds it whole: rank 0 publishes it
            lay = whole_on_rank0(local.numel() * size, world, self.shard_bytes)
        _, rank = world_and_rank()
        start, end = lay.regions[rank]
        flat = local.to(torch_dtype(self.dtype)).contiguous().reshape(-1).view(torch.uint8)
        if flat.data_ptr() != local.data_ptr() or not flat.numel():
            self._fresh.add(name)  # cast or copied: a buffer of its own, which the span may be
        if start == end:
            flat = flat[:0]  # a whole tensor on a rank other than 0, or an empty chunk
        if flat.numel() != end - start:
            raise ValueError(f"cannot publish {name}: this rank holds {flat.numel()} bytes of it where its "
                             f"dim-0 chunk is {end - start}")
        return lay, flat

    def _whole(self, name, shape, off, n, chunk: torch.Tensor):
        buf = memoryview(chunk.numpy()).cast("B")
        return ShardRef(name, "", off, n, self.dtype, shape, shard_hash(buf)), buf

    def _diffed(self, name, shape, off, n, new: torch.Tensor, before: ShardRef | None, old: torch.Tensor | None,
                base_bytes, encoded: dict):
        """A shard diffed on its device against the one published last at its position: (ref, bytes or
        None if unchanged); its delta from that one goes into `encoded`."""
        if before is not None and before.nbytes == n == 0:
            return before, None
        if before is None or old is None or before.nbytes != n:
            self.host_bytes += n
            return self._whole(name, shape, off, n, _to_host(new))
        iv = _INT[itemsize(self.dtype)]
        a, b = old.view(iv), new.view(iv)
        idx = torch.nonzero(a != b).reshape(-1)
        if idx.numel() == 0:  # unchanged: the same hash, bytes already held
            return before, None
        if idx.numel() * 2 >= b.numel():  # most changed: the host gets it whole (and receivers dense)
            self.host_bytes += n
            ref, buf = self._whole(name, shape, off, n, _to_host(new))
            encoded[(before.hash, ref.hash)] = None
            return ref, buf
        pos = idx.to(torch.int32).cpu().numpy().astype(np.int64)
        vals = b[idx].cpu().numpy()
        self.host_bytes += pos.nbytes // 2 + vals.nbytes  # int32 positions, the values in their width
        out = bytearray(base_bytes(before.hash))
        view = np.frombuffer(out, dtype=vals.dtype.str.replace("i", "u"))
        olds = view[pos].astype(np.int64)
        view[pos] = vals.view(view.dtype)
        buf = memoryview(out)
        h = shard_hash(buf)
        d = deltas.Delta(before.hash, h, deltas.gaps_encode(pos),
                         deltas.changes_encode(view[pos].astype(np.int64) - olds))
        encoded[(before.hash, h)] = d if d.nbytes < n else None
        return ShardRef(name, "", off, n, self.dtype, shape, h), buf


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy the store can keep (`t` is a view of a span kept as the next version's base)."""
    return t.to("cpu", copy=True)


def _span(lay: Layout, rank: int, local: torch.Tensor, pieces: list[tuple[int, torch.Tensor]],
          fresh: bool) -> torch.Tensor:
    """The bytes of this rank's shards of a parameter: its own rows' part, then the tails sent by others.
    A buffer of its own, never a view of a live parameter; `local` itself where it is one (`fresh`) and
    already all of it."""
    lo, hi = lay.span(rank)
    start, end = lay.regions[rank]
    if fresh and not pieces and (lo, hi) == (start, end):
        return local
    span = torch.empty(hi - lo, dtype=torch.uint8, device=local.device)
    a, b = max(lo, start), min(hi, end)
    if a < b:
        span[a - lo:b - lo] = local[a - start:b - start]
    for at, piece in pieces:
        span[at - lo:at - lo + piece.numel()] = piece
    return span


def _exchange(layouts: dict[str, Layout], locals_: dict[str, torch.Tensor], rank: int,
              world: int) -> dict[str, list[tuple[int, torch.Tensor]]]:
    """Send every other rank the bytes of ours its shards need; receive ours. One message per pair of
    ranks, the pieces in name order. Returns {name: [(offset in the parameter, bytes)]}."""
    if world == 1:
        return {}
    import torch.distributed as dist

    sends: dict[int, list[torch.Tensor]] = {}
    wants: dict[int, list[tuple[str, int, int]]] = {}
    for name, lay in layouts.items():
        start = lay.regions[rank][0]
        for src, dst, lo, hi in lay.transfers():
            if src == rank:
                sends.setdefault(dst, []).append(locals_[name][lo - start:hi - start])
            elif dst == rank:
                wants.setdefault(src, []).append((name, lo, hi))
    device = next(iter(locals_.values())).device if locals_ else torch.device("cpu")
    bufs = {src: torch.empty(sum(hi - lo for _, lo, hi in w), dtype=torch.uint8, device=device)
            for src, w in wants.items()}
    ops = [dist.P2POp(dist.irecv, buf, src) for src, buf in bufs.items()]
    ops += [dist.P2POp(dist.isend, torch.cat(pieces), dst) for dst, pieces in sends.items()]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    out: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for src, w in wants.items():
        at = 0
        for name, lo, hi in w:
            out.setdefault(name, []).append((lo, bufs[src][at:at + hi - lo]))
            at += hi - lo
    return out


def union(parts: list[Manifest]) -> Manifest:
    """The version's manifest from every rank's part: each shard once, in `shard_params`' order."""
    refs = sorted((r for p in parts for r in p.shards), key=lambda r: (r.param, r.offset))
    positions = [r.position for r in refs]
    if len(set(positions)) != len(positions):
        raise ValueError("two ranks published a shard at the same position")
    return Manifest(parts[0].version, tuple(refs))
