"""How long a weight version takes to reach each site, from the runtime's own sync planner.

The simulator builds a manifest of `shards` equal byte ranges (every one changed: a RL step touches
every tensor) and asks `rose.runtime.weights.plan.plan_sync` (or `plan_full` without relays) for the
hops, exactly as the trainer's sync driver does. A hop carries `changed_fraction` of its shard when
the plan sends a delta, the whole shard otherwise. Hops of one level run together (the runtime
starts level k when level k-1 is done); a level lasts as long as its busiest link: each instance's
NIC (sent or received bytes) or a slow link between sites (all bytes crossing it).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from rose.runtime.weights.plan import Receiver, plan_full, plan_sync
from rose.runtime.weights.shards import Manifest, ShardRef

SOURCE = "trainer"


def _manifest(version: int, shards: int, nbytes: float) -> Manifest:
    size = int(nbytes // shards)
    return Manifest(version, tuple(ShardRef(f"w{i}", "", 0, size, "bfloat16", (size // 2,), f"{version:08x}{i:024x}")
                                   for i in range(shards)))


@dataclass(frozen=True)
class SyncTimes:
    per_site: dict  # site -> seconds from publish until every receiver there holds the version
    bytes_moved: float  # over every hop
    bytes_inter: float  # over the slow links between sites


def sync_times(sites: dict[str, int], source_site: str, weight_bytes: float, intra_gbit: float, inter_gbit: float,
               sparse: bool = True, relays: bool = True, changed_fraction: float = 0.03,
               shards: int = 32) -> SyncTimes:
    """`sites`: site -> number of receiving instances. The trainer (the source) sits in `source_site`."""
    prev, new = _manifest(0, shards, weight_bytes), _manifest(1, shards, weight_bytes)
    receivers, site_of = [], {SOURCE: source_site}
    for site, n in sorted(sites.items()):
        for i in range(n):
            addr = f"{site}/{i}"
            site_of[addr] = site
            receivers.append(Receiver(addr, site, version=0 if sparse else -1,
                                      holds=frozenset(prev.hashes()) if sparse else frozenset()))
    if not receivers:
        return SyncTimes({}, 0.0, 0.0)
    if relays:
        plan = plan_sync(new, receivers, SOURCE, source_site, prev=prev if sparse else None)
    else:
        plan = plan_full(new, receivers, SOURCE)
    shard_bytes = weight_bytes / shards
    nic, inter = intra_gbit * 1e9 / 8, inter_gbit * 1e9 / 8  # bytes/s
    done: dict[str, float] = {}
    t, moved, crossed = 0.0, 0.0, 0.0
    for k in range(plan.num_levels):
        sent, recv, link = defaultdict(float), defaultdict(float), defaultdict(float)
        dsts = []
        for dst, hops in plan.level(k).items():
            dsts.append(dst)
            for h in hops:
                b = shard_bytes * (changed_fraction if h.base is not None else 1.0)
                sent[h.src] += b
                recv[dst] += b
                moved += b
                if site_of[h.src] != site_of[dst]:
                    link[(site_of[h.src], site_of[dst])] += b
                    crossed += b
        t += max([v / nic for v in sent.values()] + [v / nic for v in recv.values()]
                 + [v / inter for v in link.values()] + [0.0])
        for dst in dsts:
            done[dst] = t
    per_site: dict[str, float] = {}
    for addr, tt in done.items():
        per_site[site_of[addr]] = max(per_site.get(site_of[addr], 0.0), tt)
    return SyncTimes(per_site, moved, crossed)


def sync_step(sim, version: int) -> None:
    """Publish `version` to every site holding a rollout instance that takes weights over the network
    (colocated engines reload in place; ideal's serving instances get theirs for free), and schedule
    each site's arrival."""
    sites: dict[str, int] = {}
    for inst in sim.insts.values():
        if sim.colocated and inst.kind == "dedicated":
            continue
        if sim.policy == "ideal" and inst.kind == "serving":
            inst.version = version
        elif inst.up:
            sites[inst.site] = sites.get(inst.site, 0) + 1
    times = sim.plat.sync(sites)
    sim.r.sync_s.append(max(times.per_site.values(), default=0.0))
    sim.r.bytes_moved += times.bytes_moved
    for site, dt in times.per_site.items():
        sim._at(sim.now + dt, "synced", site, version)
