"""A worker's side of weight transfer: its shard store, and the Dask comm handlers around it.

Every ROSE worker has one `WeightEndpoint`. On the trainer it publishes versions; on rollout workers
it stages shards for the next version and commits them to the engine in one swap. Any holder of a
shard serves it by hash (`rose_weights_get`), dense or as a delta against a base the caller holds,
so relays are ordinary receivers. Handlers are registered on the worker's comm server, so transfer
uses whatever comm the cluster is configured with (TCP or TLS).
"""
from __future__ import annotations

import asyncio
import logging
import time

import torch
from distributed.protocol import to_serialize

from rose.errors import EngineError
from rose.runtime.weights import delta as deltas
from rose.runtime.weights.plan import Hop, Receiver
from rose.runtime.weights.shards import DEFAULT_SHARD_BYTES, Manifest, assemble, shard_hash, shard_params
from rose.runtime.weights.store import ShardStore

logger = logging.getLogger("rose.weights")

BATCH_BYTES = 32 << 20  # at most this many shard bytes per request: bounds memory on both ends


class WeightEndpoint:
    def __init__(self, worker, site: str, dtype: str = "bfloat16", shard_bytes: int = DEFAULT_SHARD_BYTES):
        self.worker = worker
        self.site = site  # network site (workers behind one fast network); from --rose-site
        self.dtype = dtype  # what engines hold; set per run from the engine config
        self.shard_bytes = shard_bytes
        self.store = ShardStore()
        self.manifest: Manifest | None = None  # the committed version
        self.prev: Manifest | None = None  # publisher only: the version before, kept for deltas
        self.staged: Manifest | None = None
        self.sent_bytes = 0  # payload bytes this endpoint served (dense + delta)
        self.received_bytes = 0
        self.received_dense_bytes = 0  # of which whole shards (the rest: deltas)
        self.refetches = 0  # shards that arrived bad and were fetched again
        for name in ("get", "state", "pull", "commit", "digest"):
            worker.handlers[f"rose_weights_{name}"] = getattr(self, f"_h_{name}")

    @property
    def version(self) -> int:
        return self.manifest.version if self.manifest else -1

    def reset(self, dtype: str, shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        """Forget every version (a new run starts)."""
        self.store = ShardStore()
        self.manifest = self.prev = self.staged = None
        self.dtype, self.shard_bytes = dtype, shard_bytes

    # ---------------------------------------------------------------- publisher (trainer)
    def publish(self, tensors: dict, version: int) -> Manifest:
        """Shard and hash `tensors` as `version`; keeps this version and the one before."""
        manifest, data = shard_params(tensors, version, self.dtype, self.shard_bytes)
        for h, b in data.items():
            self.store.put(h, b, verify=False)  # hashed just now
        self.store.retain(manifest)
        if self.prev is not None:
            self.store.release(self.prev)
        self.prev, self.manifest = self.manifest, manifest
        return manifest

    # ---------------------------------------------------------------- receiver (rollout worker)
    def adopt(self, tensors: dict, version: int) -> Manifest:
        """Hold `tensors` as the committed `version` (what the engine was loaded with)."""
        manifest, data = shard_params(tensors, version, self.dtype, self.shard_bytes)
        for h, b in data.items():
            self.store.put(h, b, verify=False)
        self.store.retain(manifest)
        if self.manifest is not None:
            self.store.release(self.manifest)
        self.manifest = manifest
        return manifest

    def receiver(self) -> Receiver:
        return Receiver(self.worker.address, self.site, self.version, frozenset(self.manifest.hashes())
                        if self.manifest else frozenset())

    async def _fetch(self, src: str, hops: list[Hop], sizes: dict[str, int]) -> list[Hop]:
        """Fetch `hops` from `src` in bounded batches into the store; returns the hops that came bad."""
        bad, batch, nbytes = [], [], 0
        for i, hop in enumerate(hops):
            batch.append(hop)
            nbytes += sizes[hop.hash]
            if nbytes >= BATCH_BYTES or i == len(hops) - 1:
                items = [[h.hash, h.base] for h in batch]
                replies = await self.worker.rpc(src).rose_weights_get(items=items)
                # Hashing and delta decoding are CPU work: off the event loop, which keeps heartbeats.
                ok = await asyncio.to_thread(lambda b=batch, r=replies: [self._accept(h, x) for h, x in zip(b, r)])
                bad += [hop for hop, good in zip(batch, ok) if not good]
                batch, nbytes = [], 0
        return bad

    def _accept(self, hop: Hop, reply: dict) -> bool:
        if reply is None:
            return False
        if "dense" in reply:
            data = reply["dense"]
            self.received_bytes += len(data)
            self.received_dense_bytes += len(data)
            return self.store.put(hop.hash, data)
        d = deltas.Delta(reply["base"], hop.hash, reply["positions"], reply["values"])
        self.received_bytes += d.nbytes
        if d.base not in self.store:
            return False
        out = deltas.verified_apply(self.store.get(d.base), d, self.dtype)
        return out is not None and self.store.put(hop.hash, bytes(out), verify=False)  # verified above

    async def pull(self, hops: list[Hop], manifest: Manifest) -> dict:
        """Stage the shards of `hops`; a shard that arrives bad is fetched again, dense, from the
        hop's other holders. Raises if a shard cannot be had intact from anyone."""
        sizes = {s.hash: s.nbytes for s in manifest.shards}
        self.staged = manifest
        by_src: dict[str, list[Hop]] = {}
        for h in hops:
            by_src.setdefault(h.src, []).append(h)
        results = await asyncio.gather(*(self._fetch(src, hs, sizes) for src, hs in by_src.items()))
        for hop in (h for bad in results for h in bad):
            self.refetches += 1
            logger.warning("shard %s from %s failed its hash check; fetching it again", hop.hash, hop.src)
            for alt in hop.fallback:
                if not await self._fetch(alt, [Hop(alt, hop.dst, hop.hash, None, hop.level)], sizes):
                    break
            else:
                raise EngineError(f"shard {hop.hash} of version {manifest.version} failed its hash check from "
                                  f"{hop.src} and every other holder {list(hop.fallback)}")
        return {"staged": len(hops)}

    def commit(self, version: int) -> dict:
        """Swap to the staged version: returns the full named tensors for the engine. Every shard
        must be in the store (they were verified on arrival)."""
        m = self.staged
        if m is None or m.version != version:
            raise EngineError(f"cannot commit version {version}: staged is "
                              f"{m.version if m else None}", worker=self.worker.address)
        self.store.retain(m)  # raises if a shard is missing: never commit a partial version
        tensors = assemble(m, self.store.get)
        if self.manifest is not None:
            self.store.release(self.manifest)
        self.manifest, self.staged = m, None
        self.store.drop_unreferenced()
        return tensors

    # ---------------------------------------------------------------- handlers
    async def _h_get(self, items: list) -> list:
        return await asyncio.to_thread(self._serve, items)

    def _serve(self, items: list) -> list:
        """Shards by hash: [hash, base or None] -> {"dense": bytes} or a delta, None if unknown."""
        out = []
        for h, base in items:
            if h not in self.store:
                out.append(None)
                continue
            data = self.store.get(h)
            d = None
            if base is not None and base in self.store:
                d = deltas.encode(self.store.get(base), data, self.dtype, base, h)
            if d is None:
                out.append({"dense": bytes(data)})
                self.sent_bytes += len(data)
            else:
                out.append({"base": base, "positions": d.positions, "values": d.values})
                self.sent_bytes += d.nbytes
        return out

    def _h_state(self) -> dict:
        return {"receiver": to_serialize(self.receiver()), "sent_bytes": self.sent_bytes,
                "received_bytes": self.received_bytes, "received_dense_bytes": self.received_dense_bytes,
                "refetches": self.refetches}

    async def _h_pull(self, hops, manifest) -> dict:
        t0 = time.perf_counter()
        out = await self.pull(hops, manifest)
        return out | {"seconds": time.perf_counter() - t0}

    async def _h_commit(self, version: int) -> dict:
        from rose.worker import rose_worker_of

        t0 = time.perf_counter()
        tensors = await asyncio.to_thread(self.commit, version)
        plugin = rose_worker_of(self.worker)
        if plugin is not None and plugin.loop is not None:
            await asyncio.wrap_future(plugin.loop.load_weights(tensors, version))
        return {"worker": self.worker.address, "weight_version": version, "seconds": time.perf_counter() - t0}

    def _h_digest(self) -> dict:
        """xxh3 of every committed parameter's bytes, to check receivers against the source."""
        if self.manifest is None:
            return {}
        return {k: tensor_digest(v) for k, v in assemble(self.manifest, self.store.get).items()}


def tensor_digest(t: torch.Tensor) -> str:
    return shard_hash(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
