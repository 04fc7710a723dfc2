"""A worker's side of weight transfer: its shard store, the versions it holds, and what it does with them.

Every ROSE worker has one `WeightEndpoint`. On the trainer it publishes versions, each only once the
sync of the one before has finished; on rollout workers it stages shards for the next version and
commits them to the engine in one swap (the `on_commit` callback). Any holder of a shard serves it
by hash (`rose_weights_get`), dense or as a delta against a base the caller holds, so relays are
ordinary receivers. The Dask comm handlers are in `handlers.py`.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from typing import Awaitable, Callable

from rose.errors import EngineError
from rose.runtime.weights import delta as deltas
from rose.runtime.weights.handlers import EndpointHandlers
from rose.runtime.weights.plan import Hop, Origin, Receiver
from rose.runtime.weights.shards import DEFAULT_SHARD_BYTES, Manifest, assemble, shard_params
from rose.runtime.weights.store import ShardStore

logger = logging.getLogger("rose.weights")

BATCH_BYTES = 32 << 20  # at most this many shard bytes per request: bounds memory on both ends
PUBLISH_WAIT_S = 600.0  # how long a publish waits for the sync of the version before it


class WeightEndpoint(EndpointHandlers):
    def __init__(self, worker, site: str, on_commit: Callable[[dict, int], Awaitable] | None = None,
                 on_committed: Callable[[], None] | None = None, dtype: str = "bfloat16",
                 shard_bytes: int = DEFAULT_SHARD_BYTES):
        """`on_commit(tensors, version)`: loads a synced version into this worker's engine (awaited on the
        event loop; if it raises, the endpoint keeps its version too); None: no engine to load into.
        `on_committed()`: called once a commit is done (the worker reports its new version)."""
        self.worker = worker
        self.site = site  # network site (workers behind one fast network); from --rose-site
        self.on_commit = on_commit
        self.on_committed = on_committed
        # () -> why the engine behind `on_commit` takes no more versions (a load into it failed), or None:
        # a sync leaves such a receiver out (`rose.ops.train`)
        self.unusable: Callable[[], str | None] = lambda: None
        self.dtype = dtype  # what engines hold; set per run from the engine config
        self.shard_bytes = shard_bytes
        self.store = ShardStore()
        self.manifest: Manifest | None = None  # the committed version
        self.prev: Manifest | None = None  # publisher only: the version before, kept for deltas
        # Publisher: this worker's own shards of the version and of the one before (a sharded trainer's
        # rank holds a part of each; one trainer all of it), and which rank serves which shard.
        self._own: Manifest | None = None
        self._own_prev: Manifest | None = None
        self.origins: tuple[Origin, ...] = ()
        self.staged: Manifest | None = None
        self.sent_bytes = 0  # payload bytes this endpoint served (dense + delta)
        self.received_bytes = 0
        self.received_dense_bytes = 0  # of which whole shards (the rest: deltas)
        self.received_from: Counter = Counter()  # payload bytes by the address that served them
        self.timing: Counter = Counter()  # seconds: request_s (waiting on replies), apply_s, serve_s
        self.refetches = 0  # shards that arrived bad and were fetched again
        # Deltas already encoded, by (base, target): a source serves the same delta to every site
        # and every relay of its own site; encoding it once is most of the source's CPU time.
        self._deltas: dict[tuple[str, str], deltas.Delta | None] = {}
        # Shards this receiver is about to fetch, so that as a relay it can be asked for them early:
        # a request waits for the shard instead of waiting for a whole plan level to finish.
        self._expected: dict[str, asyncio.Event] = {}
        # Publisher: the last version whose sync finished (or failed: `sync_error`), so that a train step
        # that overlaps a sync publishes its version only after that sync is done reading this one.
        self._synced = threading.Condition()
        self.synced_version = -1
        self.sync_error: str | None = None
        self.publish_wait_s = 0.0  # seconds the last publish waited for the sync before it
        self._register_handlers(worker)

    @property
    def version(self) -> int:
        return self.manifest.version if self.manifest else -1

    @property
    def own(self) -> Manifest | None:
        """Publisher: this worker's own shards of the version it publishes (a sharded trainer's rank: its part)."""
        return self._own

    def reset(self, dtype: str, shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        """Forget every version (a new run starts)."""
        self.store = ShardStore()
        self.manifest = self.prev = self.staged = self._own = self._own_prev = None
        self.origins = ()
        self._deltas.clear()
        for h in list(self._expected):
            self._arrived(h)
        self.dtype, self.shard_bytes = dtype, shard_bytes
        with self._synced:
            self.synced_version, self.sync_error = -1, None

    def mark_synced(self, version: int, error: str | None = None) -> None:
        """The sync of `version` finished (or failed with `error`)."""
        with self._synced:
            if error is None:
                self.synced_version = max(self.synced_version, version)
            self.sync_error = error
            self._synced.notify_all()

    def wait_synced(self, version: int, timeout_s: float = PUBLISH_WAIT_S) -> None:
        """Block (a task thread, never the event loop) until the sync of `version` has finished."""
        with self._synced:
            if not self._synced.wait_for(lambda: self.synced_version >= version or self.sync_error, timeout_s):
                raise EngineError(f"the sync of weight version {version} did not finish in {timeout_s:.0f} s",
                                  worker=self.worker.address)
            if self.synced_version < version:
                raise EngineError(f"the sync of weight version {version} failed: {self.sync_error}",
                                  worker=self.worker.address)

    # ---------------------------------------------------------------- publisher (trainer)
    def publish(self, tensors: dict, version: int, timeout_s: float = PUBLISH_WAIT_S) -> Manifest:
        """Shard and hash `tensors` as `version`; keeps this version and the one before. A task thread
        calls it, never the event loop: it blocks until the version published now has been synced
        (`mark_synced`), since a running sync serves that version's shards and deltas, which this
        replaces. Raises EngineError if that sync failed or did not finish in `timeout_s`."""
        manifest, data = shard_params(tensors, version, self.dtype, self.shard_bytes)
        self.wait_before_publish(timeout_s)
        self.hold(manifest, data)
        return manifest

    def wait_before_publish(self, timeout_s: float = PUBLISH_WAIT_S) -> None:
        """Wait for the sync of the version held now (see `publish`); its wait is `publish_wait_s`."""
        t0 = time.perf_counter()
        self.wait_synced(self.version, timeout_s)
        self.publish_wait_s = time.perf_counter() - t0

    def hold(self, own: Manifest, data: dict, encoded: dict | None = None, whole: Manifest | None = None,
             origins: tuple[Origin, ...] = ()) -> None:
        """Serve `own`, this worker's shards of a version (`data`: {hash: bytes} of those not held yet), as
        the published version `whole` (every rank's shards; `own` itself for one trainer, and on a peer
        rank, which is never synced from). `encoded`: deltas already made from the device's arrays;
        the other changed shards' deltas are encoded here, once, each then served to every site and relay
        as it is (receivers one version behind are the usual case). `origins`: which rank serves which
        shard (`plan_sync`); () for one trainer. The caller has waited for the previous sync."""
        self.store.recycle = False  # a publisher never applies deltas: no one would take the buffers back
        for h, b in data.items():
            self.store.put(h, b, verify=False)  # hashed just now
        self.store.retain(own)
        if self._own_prev is not None:
            self.store.release(self._own_prev)
        self._own_prev, self._own = self._own, own
        self.prev, self.manifest = self.manifest, whole if whole is not None else own
        self.origins = origins
        self._deltas = dict(encoded or {})
        if self._own_prev is not None:
            for s in own.diff(self._own_prev):
                if (old := self._own_prev.at(s.position)) is not None and old.nbytes == s.nbytes:
                    self._delta(old.hash, s.hash)

    def _delta(self, base: str, target: str) -> deltas.Delta | None:
        if (base, target) not in self._deltas:
            self._deltas[(base, target)] = deltas.encode(self.store.get(base), self.store.get(target), self.dtype,
                                                         base, target)
        return self._deltas[(base, target)]

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
                t0 = time.perf_counter()
                replies = list(await self.worker.rpc(src).rose_weights_get(items=items))
                replies += [None] * (len(batch) - len(replies))  # a short answer: the rest count as bad
                t1 = time.perf_counter()
                # Hashing and delta decoding are CPU work: off the event loop, which keeps heartbeats.
                ok = await asyncio.to_thread(lambda b=batch, r=replies: [self._accept(h, x) for h, x in zip(b, r)])
                self.timing["request_s"] += t1 - t0
                self.timing["apply_s"] += time.perf_counter() - t1
                self.received_from[src] += sum(_payload_bytes(x) for x in replies)
                bad += [hop for hop, good in zip(batch, ok) if not good]
                for hop, good in zip(batch, ok):
                    if good:
                        self._arrived(hop.hash)
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
        d = deltas.Delta.from_wire(hop.hash, reply)
        self.received_bytes += d.nbytes
        if d.base not in self.store:
            return False
        base = self.store.get(d.base)
        buf = self.store.take(len(base))
        out = deltas.verified_apply(base, d, self.dtype, out=buf)
        if out is None:
            self.store.give_back(buf)
            return False
        self._deltas[(d.base, d.target)] = d  # a relay passes the same delta on, without encoding it again
        return self.store.put(hop.hash, out, verify=False)  # verified above

    async def pull(self, hops: list[Hop], manifest: Manifest) -> dict:
        """Stage the shards of `hops`; a shard that arrives bad is fetched again, dense, from the
        hop's other holders. Raises if a shard cannot be had intact from anyone."""
        sizes = {s.hash: s.nbytes for s in manifest.shards}
        self.staged = manifest
        by_src: dict[str, list[Hop]] = {}
        for h in hops:
            by_src.setdefault(h.src, []).append(h)
        try:
            results = await asyncio.gather(*(self._fetch(src, hs, sizes) for src, hs in by_src.items()))
            for hop in (h for bad in results for h in bad):
                self.refetches += 1
                logger.warning("shard %s from %s failed its hash check; fetching it again", hop.hash, hop.src)
                for alt in hop.fallback:
                    if not await self._fetch(alt, [Hop(alt, hop.dst, hop.hash, None, hop.level)], sizes):
                        self._arrived(hop.hash)
                        break
                else:
                    raise EngineError(f"shard {hop.hash} of version {manifest.version} failed its hash check from "
                                      f"{hop.src} and every other holder {list(hop.fallback)}")
        finally:  # whoever waits on this relay for a shard it never got asks someone else
            for h in hops:
                self._arrived(h.hash)
        return {"staged": len(hops)}

    def expect(self, hashes) -> None:
        for h in hashes:
            if h not in self.store:
                self._expected.setdefault(h, asyncio.Event())

    def _arrived(self, h: str) -> None:
        ev = self._expected.pop(h, None)
        if ev is not None:
            ev.set()

    def staged_tensors(self, version: int) -> dict:
        """The staged version as full named tensors (for the engine), its shards now held. Every
        shard must be in the store (each was verified on arrival): never a partial version."""
        m = self.staged
        if m is None or m.version != version:
            raise EngineError(f"cannot commit version {version}: staged is "
                              f"{m.version if m else None}", worker=self.worker.address)
        self.store.retain(m)  # raises KeyError naming a missing shard
        try:
            return assemble(m, self.store.get)
        except BaseException:
            self.store.release(m)
            raise

    def commit(self) -> None:
        """The engine now runs the staged version: it becomes the committed one."""
        if self.manifest is not None:
            self.store.release(self.manifest)
        self.manifest, self.staged = self.staged, None
        self.store.drop_unreferenced()
        self._deltas.clear()

    def abort(self) -> int:
        """Drop a staged version (the sync failed elsewhere, or was only measured); keep the committed one."""
        self.staged = None
        return self.store.drop_unreferenced()


def _payload_bytes(reply) -> int:
    if reply is None:
        return 0
    return len(reply["dense"]) if "dense" in reply else len(reply["positions"]) + len(reply["values"]) + 16

