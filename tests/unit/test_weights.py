"""Shards, deltas, the store and the sync plan: pure logic, no processes."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rose.errors import ConfigError
from rose.runtime.weights import delta
from rose.runtime.weights.plan import Origin, Receiver, plan_full, plan_sync
from rose.runtime.weights.shards import TPSlice, assemble, shard_hash, shard_params
from rose.runtime.weights.store import ShardStore

DTYPES = ["float32", "bfloat16", "float16"]


def _tensors(seed, n_params=3, max_elems=700):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(n_params):
        rows = int(torch.randint(1, 8, (), generator=g)) * 2
        cols = int(torch.randint(1, max_elems // 16 + 2, (), generator=g))
        out[f"layers.{i}.mlp.up_proj.weight"] = torch.randn(rows, cols, generator=g)
    out["norm.weight"] = torch.ones(5)
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), dtype=st.sampled_from(DTYPES), shard_bytes=st.sampled_from([8, 64, 120, 4096]),
       frac=st.floats(0.0, 1.0))
def test_shard_delta_apply_round_trip_is_exact(seed, dtype, shard_bytes, frac):
    old = _tensors(seed)
    g = torch.Generator().manual_seed(seed + 1)
    new = {k: torch.where(torch.rand(v.shape, generator=g) < frac, v + torch.randn(v.shape, generator=g), v)
           for k, v in old.items()}
    m0, d0 = shard_params(old, 0, dtype, shard_bytes)
    m1, d1 = shard_params(new, 1, dtype, shard_bytes)
    assert all(shard_hash(d1[s.hash]) == s.hash for s in m1.shards)
    rebuilt = {}
    for s in m1.shards:
        base = m0.at(s.position)
        d = delta.encode(d0[base.hash], d1[s.hash], dtype, base.hash, s.hash)
        if d is None:
            rebuilt[s.hash] = bytes(d1[s.hash])
        else:
            assert d.nbytes < s.nbytes
            rebuilt[s.hash] = bytes(delta.verified_apply(d0[base.hash], d, dtype))
    out = assemble(m1, rebuilt.__getitem__)
    for k, v in new.items():
        want = v.to(out[k].dtype)
        assert torch.equal(out[k].view(torch.uint8), want.contiguous().view(torch.uint8)), k


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), changed=st.sets(st.integers(0, 2), max_size=3))
def test_manifest_diff_is_exactly_the_changed_shards(seed, changed):
    old = _tensors(seed)
    new = dict(old)
    for i in changed:
        k = f"layers.{i}.mlp.up_proj.weight"
        t = old[k].clone()
        t.view(-1)[0] += 1.0
        new[k] = t
    m0, _ = shard_params(old, 0, "float32", 64)
    m1, _ = shard_params(new, 1, "float32", 64)
    diff = m1.diff(m0)
    assert {s.param for s in diff} == {f"layers.{i}.mlp.up_proj.weight" for i in changed}
    assert all(s.offset == 0 for s in diff)  # only the first element changed
    assert len(m1.diff(None)) == len(m1.shards)


@given(st.sets(st.integers(0, 2**24), max_size=300))
def test_position_coding_round_trip(values):
    idx = np.array(sorted(values), dtype=np.int64)
    assert np.array_equal(delta.gaps_decode(delta.gaps_encode(idx)), idx)


def test_delta_with_bad_bytes_is_refused():
    base = np.arange(64, dtype=np.float32).tobytes()
    new = bytearray(base)
    new[8] ^= 0xFF
    d = delta.encode(base, bytes(new), "float32", shard_hash(base), shard_hash(bytes(new)))
    assert d is not None
    assert bytes(delta.verified_apply(base, d, "float32")) == bytes(new)
    for i in range(len(d.values)):  # any byte flipped in the compressed changes: refused, never applied
        corrupt = delta.Delta(d.base, d.target, d.positions, d.values[:i] + bytes([d.values[i] ^ 1]) + d.values[i + 1:])
        assert delta.verified_apply(base, corrupt, "float32") is None
    far = delta.encode(np.zeros(20_000, np.float32).tobytes(), np.eye(1, 20_000, 19_999, dtype=np.float32).tobytes(),
                       "float32", "a", "b")
    bad_pos = delta.Delta(d.base, d.target, far.positions, d.values)
    assert delta.verified_apply(base, bad_pos, "float32") is None


def test_bf16_small_update_changes_few_elements():
    # The premise of sparse sync: a 1e-6 update to bf16 weights changes about 1 % of them.
    w = torch.randn(256, 256) * 0.02
    upd = w + 1e-6 * torch.sign(torch.randn_like(w))
    frac = delta.changed_fraction(w.bfloat16(), upd.bfloat16())
    assert 0 < frac < 0.1


def test_tensor_parallel_slices_split_and_replicate():
    t = {"layers.0.self_attn.q_proj.weight": torch.arange(16.0).reshape(4, 4),
         "layers.0.self_attn.o_proj.weight": torch.arange(16.0).reshape(4, 4),
         "norm.weight": torch.ones(4)}
    m, data = shard_params(t, 3, "float32", 4096, slices=(TPSlice(0, 2), TPSlice(1, 2)))
    labels = {(s.param, s.slice) for s in m.shards}
    assert ("norm.weight", "") in labels and ("layers.0.self_attn.q_proj.weight", "tp1of2") in labels
    rank1 = assemble(m, data.__getitem__, "tp1of2")
    assert torch.equal(rank1["layers.0.self_attn.q_proj.weight"], t["layers.0.self_attn.q_proj.weight"][2:])
    assert torch.equal(rank1["layers.0.self_attn.o_proj.weight"], t["layers.0.self_attn.o_proj.weight"][:, 2:])
    assert torch.equal(rank1["norm.weight"], t["norm.weight"])
    with pytest.raises(ConfigError, match="rank=2 size=2"):
        TPSlice(2, 2)


def test_identical_shards_are_stored_once():
    t = {"a.weight": torch.zeros(64), "b.weight": torch.zeros(64)}
    m, data = shard_params(t, 0, "float32", 64)
    store = ShardStore()
    for h, b in data.items():
        assert store.put(h, b)
    assert len(m.shards) == 8 and len(store) == 1
    store.retain(m)
    m2, data2 = shard_params({"a.weight": torch.ones(64), "b.weight": torch.zeros(64)}, 1, "float32", 64)
    for h, b in data2.items():
        store.put(h, b)
    store.retain(m2)
    store.release(m)
    assert len(store) == 2  # zeros still held by v1's b.weight
    store.release(m2)
    assert len(store) == 0
    assert not store.put("0" * 32, b"not this")


# ---------------------------------------------------------------- plan properties
@st.composite
def sync_problems(draw):
    n_sites = draw(st.integers(1, 3))
    sites = [f"site{i}" for i in range(n_sites)]
    n_shards = draw(st.integers(1, 12))
    old_h = [f"{i:032x}" for i in range(n_shards)]
    new_h = [h if draw(st.booleans()) else f"{i + 1000:032x}" for i, h in enumerate(old_h)]
    # some shards of a version can be identical (dedup)
    if n_shards > 2 and draw(st.booleans()):
        new_h[1] = new_h[0]

    def manifest(version, hashes):
        from rose.runtime.weights.shards import Manifest, ShardRef
        return Manifest(version, tuple(ShardRef(f"p{i}", "", 0, 8, "float32", (2,), h) for i, h in enumerate(hashes)))

    prev, cur = manifest(4, old_h), manifest(5, new_h)
    receivers = []
    for i in range(draw(st.integers(1, 9))):
        state = draw(st.sampled_from(["current_minus_1", "empty", "partial"]))
        holds = {"current_minus_1": frozenset(old_h), "empty": frozenset(),
                 "partial": frozenset(draw(st.sets(st.sampled_from(old_h + new_h))))}[state]
        version = 4 if state == "current_minus_1" else -1
        receivers.append(Receiver(f"tcp://r{i}", draw(st.sampled_from(sites)), version, holds))
    source_site = draw(st.sampled_from(sites))
    origins = ()
    if draw(st.booleans()):  # a sharded trainer: two ranks, each serving its positions of both versions
        ranks = ("tcp://trainer", "tcp://rank1")
        origins = tuple(Origin(a, source_site if k == 0 else draw(st.sampled_from(sites)),
                               frozenset(h for i, h in enumerate(old_h + new_h) if i % n_shards % 2 == k))
                        for k, a in enumerate(ranks))
    return cur, prev, receivers, source_site, origins


@settings(max_examples=300, deadline=None)
@given(sync_problems())
def test_plan_delivers_exactly_once_per_link_from_holders_only(problem):
    cur, prev, receivers, source_site, origins = problem
    source = "tcp://trainer"
    plan = plan_sync(cur, receivers, source, source_site, prev, origins)
    sites = {r.address: r.site for r in receivers} | {source: source_site} | {o.address: o.site for o in origins}
    holds = {r.address: set(r.holds) for r in receivers} | {source: cur.hashes() | prev.hashes()}
    if origins:
        holds |= {o.address: set(o.holds) for o in origins}
    received = {r.address: [] for r in receivers}
    for k in range(plan.num_levels):
        arriving = []
        for dst, hops in plan.level(k).items():
            for h in hops:
                assert h.hash in holds[h.src], f"hop {h} starts where the shard is not yet"
                assert h.base is None or (h.base in holds[h.src] and h.base in holds[h.dst])
                assert all(h.hash in holds[f] for f in h.fallback)
                arriving.append((dst, h.hash))
        for dst, sh in arriving:
            holds[dst].add(sh)
            received[dst].append(sh)
    for r in receivers:
        assert cur.hashes() <= holds[r.address]
        assert sorted(received[r.address]) == sorted(cur.hashes() - r.holds)  # nothing extra, nothing twice
    assert all(n == 1 for n in plan.crossings(sites).values())
    # a receiver more than one version behind never gets a delta
    behind = {r.address for r in receivers if r.version != prev.version}
    assert all(h.base is None for h in plan.hops if h.dst in behind)


def test_plan_full_is_the_broadcast_baseline():
    from rose.runtime.weights.shards import Manifest, ShardRef
    m = Manifest(1, tuple(ShardRef(f"p{i}", "", 0, 8, "float32", (2,), f"{i:032x}") for i in range(3)))
    rs = [Receiver(f"tcp://r{i}", "b") for i in range(4)]
    plan = plan_full(m, rs, "tcp://t")
    assert len(plan.hops) == 12 and plan.num_levels == 1
    assert all(n == 4 for n in plan.crossings({"tcp://t": "a"} | {r.address: "b" for r in rs}).values())


def test_plan_rejects_source_among_receivers_and_a_shard_no_origin_holds():
    from rose.runtime.weights.shards import Manifest, ShardRef
    with pytest.raises(ConfigError, match="exclude the sources"):
        plan_sync(Manifest(1, ()), [Receiver("tcp://t", "a")], "tcp://t", "a")
    m = Manifest(1, tuple(ShardRef(f"p{i}", "", 0, 8, "float32", (2,), f"{i:032x}") for i in range(3)))
    ranks = (Origin("tcp://t", "a", frozenset({f"{0:032x}"})), Origin("tcp://u", "a", frozenset({f"{1:032x}"})))
    with pytest.raises(ConfigError, match="no origin holds 1 shards"):
        plan_sync(m, [Receiver("tcp://r", "a")], "tcp://t", "a", None, ranks)
    full = plan_full(m, [Receiver("tcp://r", "a")], "tcp://t", ranks + (Origin("tcp://v", "a", m.hashes()),))
    assert [h.src for h in full.hops] == ["tcp://t", "tcp://u", "tcp://v"]


def test_released_buffers_are_reused_and_readonly_ones_never():
    store = ShardStore()
    m, data = shard_params({"a.weight": torch.arange(32.0)}, 0, "float32", 64)
    for h, b in data.items():
        store.put(h, b)
    store.retain(m)
    held = [store.get(s.hash) for s in m.shards]
    store.release(m)
    reused = store.take(64)
    assert any(reused is b for b in held)  # a released shard's buffer comes back
    assert isinstance(store.take(64), (bytearray, memoryview)) and store.take(8) is not None
    store.put("x" * 32, b"\0" * 64, verify=False)  # bytes are read-only: never pooled
    store.drop_unreferenced()
    assert all(not memoryview(b).readonly for bufs in store._pool.values() for b in bufs)


@pytest.mark.gpu
def test_publishing_from_device_tensors_matches_the_cpu():
    # The trainer's weights live on the GPU there: shards, hashes and the changed fraction must not
    # depend on where the tensors are.
    cpu = _tensors(7)
    dev = {k: v.cuda() for k, v in cpu.items()}
    m_cpu, _ = shard_params(cpu, 1, "bfloat16", 4096)
    m_dev, _ = shard_params(dev, 1, "bfloat16", 4096)
    assert m_cpu == m_dev
    bumped = {k: v + 1e-3 for k, v in dev.items()}
    for k in dev:
        a, b = dev[k].bfloat16(), bumped[k].bfloat16()
        assert delta.changed_fraction(a, b) == delta.changed_fraction(a.cpu(), b.cpu())


def test_a_publish_waits_for_the_sync_of_the_version_before_and_fails_with_it():
    """Asynchronous mode: train step k+1 runs while step k's sync reads version k+1; it publishes
    only once that sync is done, and a failed sync fails it instead of leaving it blocked."""
    import threading
    from types import SimpleNamespace

    from rose.errors import EngineError
    from rose.runtime.weights.endpoint import WeightEndpoint

    ep = WeightEndpoint(SimpleNamespace(handlers={}, address="tcp://trainer"), "default")
    waited = threading.Event()
    t = threading.Thread(target=lambda: (ep.wait_synced(3), waited.set()))
    t.start()
    ep.mark_synced(2)
    assert not waited.wait(0.2)  # an older version's sync does not release it
    ep.mark_synced(3)
    t.join(5)
    assert waited.is_set()
    ep.wait_synced(3)  # already done: returns at once
    ep.mark_synced(4, error="OSError: receiver gone")
    with pytest.raises(EngineError, match="sync of weight version 4 failed: OSError: receiver gone"):
        ep.wait_synced(4)
    ep.reset("float32")
    with pytest.raises(EngineError, match="did not finish in 0 s"):
        ep.wait_synced(1, timeout_s=0.05)


def test_a_sync_planned_while_the_trainer_publishes_plans_from_the_versions_it_started_with():
    """A catch-up sync (a worker that joined) is not held back by a publish as a step's sync is, so the
    trainer may publish the next version while the catch-up awaits its receivers' states. Seen in a chaos
    run: it read the version before that wait and the previous version after it, and refused to plan v5
    against v5 as its previous version. It plans from one snapshot and brings the receiver to v2."""
    import asyncio
    from types import SimpleNamespace

    from rose.runtime.weights.endpoint import WeightEndpoint
    from rose.runtime.weights.sync import sync_to

    ep = WeightEndpoint(SimpleNamespace(handlers={}, address="tcp://trainer"), "default")
    ep.reset("float32", 64)

    def publish(version):
        manifest, data = shard_params(_tensors(version), version, "float32", 64)
        ep.hold(manifest, data)

    publish(1)
    publish(2)
    pulled = []

    class Receiver_:  # the joining worker's endpoint, as the trainer's rpc reaches it
        def __init__(self):
            self.version = 0

        async def rose_weights_state(self):
            if not pulled:  # the trainer's next train step publishes while the sync waits for this answer
                publish(3)
            return {"receiver": Receiver("tcp://new", "default", self.version, frozenset()), "sent_bytes": 0,
                    "received_bytes": 0, "received_dense_bytes": 0, "received_from": {}, "timing": {},
                    "refetches": 0}

        async def rose_weights_expect(self, hashes):
            return len(hashes)

        async def rose_weights_pull(self, hops, manifest):
            pulled.append(manifest.data.version)
            return {"seconds": 0.0}

        async def rose_weights_commit(self, version):
            self.version = version
            return {"worker": "tcp://new", "weight_version": version}

    new = Receiver_()
    worker = SimpleNamespace(address="tcp://trainer", rpc=lambda address: new)
    status = asyncio.run(sync_to(worker, ep, ["tcp://new"]))
    assert pulled == [2] and status["version"] == 2 and new.version == 2
    assert ep.version == 3  # the trainer moved on; the next sync brings the receiver there
