"""Sync planning: which shard goes from where to where, as a pure function of a snapshot.

Receivers sit in sites (a site: workers behind one fast network; between sites the links are slow).
Each shard a site needs crosses into it once, from the source to one relay in that site, then
spreads inside the site by doubling: at every level each holder passes it to one receiver that
lacks it, so n receivers are covered in 1 + ceil(log2 n) levels. Relays differ from shard to shard,
so no single receiver carries a site's whole inbound traffic. In the source's own site the source
takes part in the doubling. A hop carries a delta when its source and destination both hold the
shard that the previous version had at the same position; otherwise the dense shard. A sharded
trainer is several sources (`Origin`s), each the start of the shards it published.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rose.errors import ConfigError
from rose.runtime.weights.shards import Manifest


@dataclass(frozen=True)
class Receiver:
    """A sync target as the planner sees it."""

    address: str
    site: str
    version: int = -1  # weight version it holds now (-1: none)
    holds: frozenset[str] = frozenset()  # shard hashes in its store
    slices: tuple[str, ...] = ("",)  # tensor-parallel slice labels it holds ("" = whole tensors)


@dataclass(frozen=True)
class Origin:
    """Where shards start from: one trainer (holding every shard of the version and of the one before),
    or one rank of a sharded trainer, holding its own part of both (`holds`)."""

    address: str
    site: str
    holds: frozenset[str]  # hashes of this version's and the previous version's shards it serves


@dataclass(frozen=True)
class Hop:
    src: str
    dst: str
    hash: str  # the shard the destination ends up with
    base: str | None  # a shard both ends hold to send a delta against; None: send dense
    level: int  # hops of level k start once every hop of level k-1 finished
    fallback: tuple[str, ...] = ()  # holders by then to re-fetch from on a bad hash (the source last)


@dataclass(frozen=True)
class SyncPlan:
    version: int
    source: str
    hops: tuple[Hop, ...]

    @property
    def num_levels(self) -> int:
        return 1 + max((h.level for h in self.hops), default=-1)

    def level(self, k: int) -> dict[str, list[Hop]]:
        """The hops of level k, by destination."""
        out: dict[str, list[Hop]] = {}
        for h in self.hops:
            if h.level == k:
                out.setdefault(h.dst, []).append(h)
        return out

    def crossings(self, sites: dict[str, str]) -> Counter:
        """(hash, from site, to site) -> how many hops carry that shard over that inter-site link."""
        return Counter((h.hash, sites[h.src], sites[h.dst]) for h in self.hops if sites[h.src] != sites[h.dst])


def _needs(manifest: Manifest, r: Receiver) -> list[str]:
    return sorted(manifest.hashes(r.slices) - r.holds)


def _bases(manifest: Manifest, prev: Manifest | None) -> dict[str, list[str]]:
    """For each hash of `manifest`: the hashes at its positions in `prev` (delta candidates)."""
    out: dict[str, list[str]] = {}
    if prev is None:
        return out
    for s in manifest.shards:
        p = prev.at(s.position)
        if p is not None and p.hash != s.hash:
            out.setdefault(s.hash, []).append(p.hash)
    return out


def _origin_of(manifest: Manifest, source: str, source_site: str, prev: Manifest | None,
               origins: tuple[Origin, ...]):
    """hash -> the Origin that serves it: the first of `origins` that holds it; with no `origins`, the
    one source, holding every shard of `manifest` and `prev`."""
    if not origins:
        one = Origin(source, source_site, frozenset(manifest.hashes()) | (prev.hashes() if prev else frozenset()))
        return lambda h: one
    by_hash: dict[str, Origin] = {}
    for o in origins:
        for h in o.holds:
            by_hash.setdefault(h, o)
    missing = manifest.hashes() - by_hash.keys()
    if missing:
        raise ConfigError(f"no origin holds {len(missing)} shards of version {manifest.version} "
                          f"(first {sorted(missing)[0]})")
    return by_hash.__getitem__


def plan_sync(manifest: Manifest, receivers: list[Receiver], source: str, source_site: str,
              prev: Manifest | None = None, origins: tuple[Origin, ...] = ()) -> SyncPlan:
    """Plan moving `manifest` to `receivers` from `source` (which holds every shard of it and of `prev`),
    or, with `origins` (the ranks of a sharded trainer), each shard from the first origin holding it.

    Deltas are planned only toward receivers exactly one version behind (`prev` is that version);
    a receiver further behind gets dense shards.
    """
    if prev is not None and prev.version >= manifest.version:
        raise ConfigError(f"previous manifest v{prev.version} is not older than v{manifest.version}")
    addrs = [r.address for r in receivers]
    starts = {source} | {o.address for o in origins}
    if len(set(addrs)) != len(addrs) or starts & set(addrs):
        raise ConfigError(f"receivers must be distinct and exclude the sources {sorted(starts)}: {addrs}")
    by_addr = {r.address: r for r in receivers}
    bases = _bases(manifest, prev)
    delta_ok = {r.address for r in receivers if prev is not None and r.version == prev.version}
    origin_of = _origin_of(manifest, source, source_site, prev, origins)

    # (site, hash) -> receivers that need it
    wanted: dict[tuple[str, str], list[str]] = {}
    for r in sorted(receivers, key=lambda r: r.address):
        for h in _needs(manifest, r):
            wanted.setdefault((r.site, h), []).append(r.address)

    def base_for(h: str, src: str, dst: str, origin: Origin) -> str | None:
        if dst not in delta_ok:
            return None
        src_holds = origin.holds if src == origin.address else by_addr[src].holds
        for b in bases.get(h, ()):
            if b in by_addr[dst].holds and b in src_holds:
                return b
        return None

    hops: list[Hop] = []
    for (site, h), dsts in sorted(wanted.items()):
        origin = origin_of(h)
        turn = int(h[:8], 16) % len(dsts)  # a different relay per shard spreads the inbound load
        pending = dsts[turn:] + dsts[:turn]
        level = 0
        if site == origin.site:
            holders = [origin.address]
        else:  # the one crossing of the slow link into this site
            first = pending.pop(0)
            hops.append(Hop(origin.address, first, h, base_for(h, origin.address, first, origin), 0,
                            (origin.address,)))
            holders, level = [first], 1
        while pending:
            new = []
            for src in list(holders):
                if not pending:
                    break
                dst = pending.pop(0)
                others = tuple(x for x in holders if x not in (src, origin.address)) + (origin.address,)
                hops.append(Hop(src, dst, h, base_for(h, src, dst, origin), level, others))
                new.append(dst)
            holders += new
            level += 1
    return SyncPlan(manifest.version, source, tuple(hops))


def plan_full(manifest: Manifest, receivers: list[Receiver], source: str,
              origins: tuple[Origin, ...] = ()) -> SyncPlan:
    """The baseline ROSE replaces: every receiver gets every shard, dense, straight from its source."""
    origin_of = _origin_of(manifest, source, "", None, origins)
    hops = tuple(Hop(origin_of(h).address, r.address, h, None, 0, (origin_of(h).address,))
                 for r in receivers for h in sorted(manifest.hashes(r.slices)))
    return SyncPlan(manifest.version, source, hops)
