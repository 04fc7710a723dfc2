"""The Dask comm handlers of a worker's `WeightEndpoint`: `rose_weights_NAME` for each NAME in `HANDLERS`.

The sync driver (`sync.py`) and the other endpoints reach a worker's shards through them. They are
registered on the worker's comm server, so transfer uses whatever comm the cluster is configured
with (TCP or TLS).
"""
from __future__ import annotations

import asyncio
import time

import torch
from distributed.protocol import to_serialize

from rose.runtime.weights.shards import assemble, shard_hash

HANDLERS = ("get", "state", "expect", "pull", "commit", "abort", "digest")
RELAY_WAIT_S = 120.0  # how long a relay holds a request for a shard it is still fetching


class EndpointHandlers:
    """Mixin of `WeightEndpoint`: its method `_h_NAME` answers `rose_weights_NAME`."""

    def _register_handlers(self, worker) -> None:
        for name in HANDLERS:
            worker.handlers[f"rose_weights_{name}"] = getattr(self, f"_h_{name}")

    async def _h_get(self, items: list) -> list:
        for h, _ in items:
            ev = self._expected.get(h)
            if ev is not None and h not in self.store:
                try:
                    await asyncio.wait_for(ev.wait(), RELAY_WAIT_S)
                except asyncio.TimeoutError:
                    pass  # served as unknown (None): the caller fetches it from another holder
        t0 = time.perf_counter()
        out = await asyncio.to_thread(self._serve, items)
        self.timing["serve_s"] += time.perf_counter() - t0
        return out

    def _h_expect(self, hashes: list) -> int:
        self.expect(hashes)
        return len(self._expected)

    def _serve(self, items: list) -> list:
        """Shards by hash: [hash, base or None] -> {"dense": bytes} or a delta, None if unknown."""
        out = []
        for h, base in items:
            if h not in self.store:
                out.append(None)
                continue
            data = self.store.get(h)
            d = self._delta(base, h) if base is not None and base in self.store else None
            if d is None:
                out.append({"dense": bytes(data)})
                self.sent_bytes += len(data)
            else:
                out.append(d.to_wire())
                self.sent_bytes += d.nbytes
        return out

    def _h_state(self) -> dict:
        return {"receiver": to_serialize(self.receiver()), "sent_bytes": self.sent_bytes,
                "received_bytes": self.received_bytes, "received_dense_bytes": self.received_dense_bytes,
                "received_from": dict(self.received_from), "timing": dict(self.timing),
                "refetches": self.refetches, "unusable": self.unusable()}

    async def _h_pull(self, hops, manifest) -> dict:
        t0 = time.perf_counter()
        out = await self.pull(hops, manifest)
        return out | {"seconds": time.perf_counter() - t0}

    async def _h_commit(self, version: int) -> dict:
        t0 = time.perf_counter()
        if self.version == version and (self.staged is None or self.staged.version == version):
            # Another sync committed this version here first (a joining worker's catch-up while an
            # asynchronous step's sync held it staged): the engine runs it already.
            self.abort()
            return {"worker": self.worker.address, "weight_version": version, "seconds": 0.0}
        tensors = await asyncio.to_thread(self.staged_tensors, version)
        if self.on_commit is not None:
            try:
                await self.on_commit(tensors, version)
            except BaseException:  # the engine kept its version: so does the endpoint
                self.store.release(self.staged)
                raise
        self.commit()
        if self.on_committed is not None:  # e.g. the placement learns the new version before the sync task returns
            self.on_committed()
        return {"worker": self.worker.address, "weight_version": version, "seconds": time.perf_counter() - t0}

    def _h_abort(self) -> dict:
        return {"dropped": self.abort()}

    def _h_digest(self) -> dict:
        """xxh3 of every committed parameter's bytes, to check receivers against the source."""
        if self.manifest is None:
            return {}
        return {k: tensor_digest(v) for k, v in assemble(self.manifest, self.store.get).items()}


def tensor_digest(t: torch.Tensor) -> str:
    return shard_hash(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
