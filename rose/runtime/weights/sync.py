"""Run one sync: from the source endpoint (the trainer; or its ranks, `Origin`s) to every receiver, then one
swap each.

Phases: ask each receiver what it holds; plan (pure, `plan.py`); run the plan, each receiver pulling
its hops from their sources, relays passing shards on as they arrive (every shard is verified on
arrival, a bad one is fetched again from another holder); then commit everywhere. A receiver swaps
its engine only when it holds every shard of the version, and no commit starts unless every receiver
staged the whole version: a sync that fails while shards move leaves every engine on its previous
version. A caller may hold each receiver's commit back until it is due (`ready`: an asynchronous step
stages the version while the next step's rollouts run and commits on each receiver once it runs none
of them: `rose.runtime.scheduler.barrier`). The commit phase is not one transaction across receivers:
each swap is atomic on its own worker (between two engine iterations), but a receiver that fails to
commit (its process dies, its engine refuses the weights) does not undo the others'. The sync then raises, naming it; the caller syncs again (`rose.ops.train.sync_weights`),
and receivers already at the version are left alone.
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from distributed.protocol import to_serialize

from rose.errors import EngineError
from rose.runtime.weights.endpoint import WeightEndpoint
from rose.runtime.weights.plan import plan_full, plan_sync


async def receiver_states(worker, addresses) -> list[dict]:
    """Each receiver's endpoint state (what it holds, its byte and refetch counters), in order."""
    return list(await asyncio.gather(*(worker.rpc(a).rose_weights_state() for a in addresses)))


async def sync_to(worker, source: WeightEndpoint, receivers: list[str], mode: str = "rose",
                  commit: bool = True, before: list[dict] | None = None,
                  ready: Callable[[str], Awaitable] | None = None) -> dict:
    """Bring `receivers` to the source's current version. `mode="full"` sends every shard dense from
    the source to every receiver (the broadcast baseline, for benchmarks); `commit=False` stages
    and then drops the version (to measure a transfer without applying it). `before`: the receivers'
    `receiver_states`, if the caller has just read them (the counters returned are from there). `ready`:
    awaited for each receiver (its address) once every receiver has staged the version, before that
    receiver's commit (`waited_s`: the longest wait, `waited_s_each`: each receiver's)."""
    # One snapshot of what the source publishes, before any wait: a catch-up sync (a worker that joined)
    # is not held back by a publish as a step's sync is, so the trainer may publish the next version
    # while this one awaits its receivers. Reading `prev` after that wait planned v5 against v5 as its
    # previous version ("previous manifest v5 is not older than v5"; a chaos run's asynchronous phase).
    manifest, prev, origins = source.manifest, source.prev, source.origins
    if manifest is None:
        raise EngineError("nothing to sync: the source has published no version", worker=worker.address)
    t0 = time.perf_counter()
    before = before if before is not None else await receiver_states(worker, receivers)
    # Receivers already at the version (an earlier attempt committed there) take no part.
    everyone = [s["receiver"] for s in before]
    done = [r for r in everyone if r.version == manifest.version and mode == "rose"]
    rs = [r for r in everyone if r.version != manifest.version or mode != "rose"]
    done_statuses = [{"worker": r.address, "weight_version": r.version} for r in done]
    if not rs:
        return {"version": manifest.version, "statuses": done_statuses, "sent_bytes": 0, "hops": 0, "seconds": 0.0}
    if mode == "full":
        plan = plan_full(manifest, rs, worker.address, origins)
    else:
        plan = plan_sync(manifest, rs, worker.address, source.site, prev, origins)
    wire_manifest = to_serialize(manifest)
    by_dst: dict[str, list] = {r.address: [] for r in rs}  # every receiver stages the version
    for hop in plan.hops:
        by_dst[hop.dst].append(hop)
    try:
        # Levels need no barrier: relays are told first what they will receive, then every receiver
        # pulls at once, and a relay holds a request for a shard until that shard has reached it.
        await asyncio.gather(*(worker.rpc(dst).rose_weights_expect(hashes=sorted({h.hash for h in hops}))
                               for dst, hops in by_dst.items()))
        t_plan = time.perf_counter()
        pulls = await asyncio.gather(*(
            worker.rpc(dst).rose_weights_pull(hops=to_serialize(hops), manifest=wire_manifest)
            for dst, hops in by_dst.items()))
    except BaseException:
        await asyncio.gather(*(worker.rpc(r.address).rose_weights_abort() for r in rs), return_exceptions=True)
        raise
    t_pulled = time.perf_counter()
    waited = {r.address: 0.0 for r in rs}

    async def commit_one(addr: str):
        # Each receiver commits once it is due, not once all are: one still running the step before's
        # rollouts does not hold back another's next ones. A wait that fails (the scheduler went away)
        # leaves this receiver on its previous version, staged version dropped; the caller syncs again.
        if ready is not None:
            try:
                await ready(addr)
            except BaseException:
                await asyncio.gather(worker.rpc(addr).rose_weights_abort(), return_exceptions=True)
                raise
            waited[addr] = time.perf_counter() - t_pulled
        return await worker.rpc(addr).rose_weights_commit(version=manifest.version)

    if commit:
        statuses = await asyncio.gather(*(commit_one(r.address) for r in rs), return_exceptions=True)
        failed = {r.address: s for r, s in zip(rs, statuses) if isinstance(s, BaseException)}
        if failed:
            raise EngineError(f"commit of weight version {manifest.version} failed on {len(failed)} of {len(rs)} "
                              "receivers (the others hold it now): " + "; ".join(
                                  f"{a}: {type(e).__name__}: {e}" for a, e in failed.items()), worker=worker.address)
    else:
        try:
            if ready is not None:
                await asyncio.gather(*(ready(r.address) for r in rs))
        finally:
            await asyncio.gather(*(worker.rpc(r.address).rose_weights_abort() for r in rs))
        statuses = [{"worker": r.address, "weight_version": r.version} for r in rs]
    after = await receiver_states(worker, receivers)
    received = sum(a["received_bytes"] - b["received_bytes"] for a, b in zip(after, before))
    dense = sum(a["received_dense_bytes"] - b["received_dense_bytes"] for a, b in zip(after, before))
    sites = {r.address: r.site for r in everyone} | {worker.address: source.site} | {
        o.address: o.site for o in origins}
    cross = sum(n - b["received_from"].get(src, 0) for a, b, r in zip(after, before, everyone)
                for src, n in a["received_from"].items() if sites.get(src, "?") != r.site)
    return {"version": manifest.version, "statuses": done_statuses + list(statuses), "sent_bytes": received, "dense_bytes": dense,
            "cross_site_bytes": cross,
            "full_bytes": manifest.nbytes * len(rs), "hops": len(plan.hops), "levels": plan.num_levels,
            "refetches": sum(a["refetches"] - b["refetches"] for a, b in zip(after, before)),
            "timing": [{k: round(v - b["timing"].get(k, 0), 3) for k, v in a["timing"].items()}
                       for a, b in zip(after, before)],
            "transfer_s": t_pulled - t0, "plan_s": t_plan - t0, "pull_s": [p["seconds"] for p in pulls],
            "waited_s": max(waited.values(), default=0.0), "waited_s_each": waited,
            "seconds": time.perf_counter() - t0}
