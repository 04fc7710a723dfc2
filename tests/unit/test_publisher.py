"""Publishing from where the weights live (rose/runtime/weights/publisher.py, ownership.py): which rank
publishes which shard, one trainer's part equal to `shard_params`, the device-side diff giving the same
shards and deltas while copying only the changes, and 2 FSDP2 ranks over gloo (real processes) whose
parts make exactly the manifest and bytes one trainer publishes."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rose.runtime.weights import delta as deltas
from rose.runtime.weights.ownership import dim0_layout, whole_on_rank0
from rose.runtime.weights.publisher import RankPublisher, union
from rose.runtime.weights.shards import assemble, shard_params
from tests.unit.test_sharding import _run_ranks, _tiny_model


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=3), st.sampled_from([2, 4]), st.integers(1, 5),
       st.sampled_from([8, 16, 24, 64]), st.integers(0, 2 ** 32 - 1))
def test_every_shard_has_one_owner_and_each_gets_exactly_its_bytes(shape, size, world, shard_bytes, salt):
    lay = dim0_layout(tuple(shape), size, world, shard_bytes, salt)
    # FSDP2's split: torch.chunk of the rows, empty chunks past the end.
    rows = list(torch.chunk(torch.arange(shape[0]), world)) if shape[0] else []
    for r, (start, end) in enumerate(lay.regions):
        n = len(rows[r]) if r < len(rows) else 0
        assert end - start == n * lay.nbytes // max(shape[0], 1)
    owned = sorted(s for r in range(world) for s in lay.owned(r))
    assert owned == lay.shards()  # each shard once, cut as one trainer cuts it
    owners = [lay.owner(o) for o, _ in lay.shards()]
    assert owners == sorted(owners)  # so each rank's shards are one contiguous range
    if world == 2:  # each shard's owner holds at least half of it: at most half the bytes move
        assert sum(b - a for *_, a, b in lay.transfers()) <= lay.nbytes // 2
    for r in range(world):
        lo, hi = lay.span(r)
        start, end = lay.regions[r]
        # Its own bytes and the pieces others send tile its span exactly.
        pieces = [(max(lo, start), min(hi, end))] if max(lo, start) < min(hi, end) else []
        pieces += [(a, b) for src, dst, a, b in lay.transfers() if dst == r]
        covered = sorted(pieces)
        assert sum(b - a for a, b in covered) == hi - lo
        assert all(covered[i][1] == covered[i + 1][0] for i in range(len(covered) - 1))
        assert not covered or (covered[0][0], covered[-1][1]) == (lo, hi)
    assert all(r == 0 for r in range(world) if whole_on_rank0(lay.nbytes, world, shard_bytes).owned(r))


def _state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(40, 24, generator=g), "b.bias": torch.randn(24, generator=g),
            "empty": torch.zeros(0), "c.weight": torch.randn(10, 8, generator=g)}


@pytest.mark.parametrize("on_device", [False, True])
def test_one_trainers_part_is_shard_params_and_the_device_diff_copies_only_changes(on_device):
    pub = RankPublisher("bfloat16", 256, on_device=on_device)
    state = _state()
    own, data, enc = pub.part(state, 0, None)
    ref, ref_data = shard_params(state, 0, "bfloat16", 256)
    assert own == ref and set(data) == set(ref_data) and not enc
    store = dict(data)
    # A sparse update: a few elements of one shard; another shard changed by more than half; the rest same.
    new = {k: v.clone() for k, v in state.items()}
    new["a.weight"][0, :3] += 1.0
    new["a.weight"][20:, :] += 1.0
    own2, data2, enc2 = pub.part(new, 1, store.__getitem__)
    ref2, ref_data2 = shard_params(new, 1, "bfloat16", 256)
    assert own2 == ref2
    changed = {s.hash for s in ref2.diff(ref)}
    for h, b in data2.items():
        assert bytes(b) == bytes(ref_data2[h])
    if on_device:
        assert set(data2) == changed  # unchanged shards never left the device
        assert pub.host_bytes < sum(len(ref_data2[h]) for h in changed)  # the sparse one sent as changes
        assert any(enc2.values()) and None in enc2.values()  # the sparse shard's delta; the dense one's none
        for (base, target), d in enc2.items():
            if d is None:
                assert deltas.encode(store[base], ref_data2[target], "bfloat16", base, target) is None
                continue
            assert bytes(deltas.verified_apply(store[base], d, "bfloat16")) == bytes(ref_data2[target])
            assert d == deltas.encode(store[base], ref_data2[target], "bfloat16", base, target)
    else:
        assert pub.host_bytes == sum(v.numel() * 2 for v in new.values())


def _rank_parts(rank, world, port, model_dir, out, on_device):
    import torch.distributed as dist

    from rose.config import GRPOConfig
    from rose.runtime.trainer import Trainer
    from tests.unit.test_trainer_microbatch import _table

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    trainer = Trainer(model_dir, device="cpu")
    pub = RankPublisher("bfloat16", 512, on_device=on_device)
    results, store = [], {}
    for step in range(2):
        if step:
            trainer.step(_table(seed=0), GRPOConfig(lr=1e-3))
        own, data, enc = pub.part(trainer.model.state_dict(), trainer.version, store.__getitem__)
        store.update(data)
        parts = [None] * world
        dist.all_gather_object(parts, (own, {h: bytes(store[h]) for h in own.hashes()}))
        full = trainer.full_state_dict()
        if rank == 0:
            results.append({"parts": parts, "full": full, "host_bytes": pub.host_bytes})
    if rank == 0:
        torch.save(results, out)
    dist.barrier()  # leave together: without it, rank 0 aborted at exit (SIGABRT) in 1 of 20 runs on a busy host
    dist.destroy_process_group()


@pytest.mark.parametrize("on_device", [False, True])
def test_two_ranks_publish_exactly_what_one_trainer_would(tmp_path, on_device):
    # Each rank publishes the shards starting in its rows (tails from the other rank); the union must be
    # shard_params of the gathered weights, position for position and hash for hash, and the bytes the
    # ranks hold must assemble into exactly those weights in bf16.
    model_dir, out = _tiny_model(tmp_path), str(tmp_path / "parts.pt")
    _run_ranks(_rank_parts, model_dir, out, on_device)
    for version, r in enumerate(torch.load(out, weights_only=False)):
        parts = [p for p, _ in r["parts"]]
        assert all(p.shards for p in parts)  # both ranks publish
        whole = union(parts)
        ref, _ = shard_params(r["full"], version, "bfloat16", 512)
        assert whole == ref
        held = {h: b for _, d in r["parts"] for h, b in d.items()}
        got = assemble(whole, held.__getitem__)
        for name, t in r["full"].items():
            assert torch.equal(got[name], t.to(torch.bfloat16)), name


def test_union_refuses_a_position_published_twice():
    own, _, _ = RankPublisher("bfloat16", 256).part(_state(), 0, None)
    with pytest.raises(ValueError, match="same position"):
        union([own, own])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_published_bytes_never_alias_the_live_weights(dtype):
    # The optimizer updates weights in place; a published version must not change with them.
    state = _state()
    own, data, _ = RankPublisher(dtype, 256).part(state, 0, None)
    before = {h: bytes(b) for h, b in data.items()}
    for t in state.values():
        t.add_(1.0)
    assert {h: bytes(b) for h, b in data.items()} == before


@pytest.mark.gpu
def test_the_publisher_on_cuda_tensors_gives_the_cpu_shards_and_copies_only_changes():
    # The GPU check of the device path: the same manifest as the CPU from CUDA weights; a sparse update
    # sends the host its changed elements only, and the shards rebuilt from them are the CPU's.
    pub = RankPublisher("bfloat16", 1 << 16)
    cpu = {k: v.repeat(64, 1) if v.dim() == 2 else v for k, v in _state().items()}
    dev = {k: v.cuda() for k, v in cpu.items()}
    own, data, _ = pub.part(dev, 0, None)
    assert own == shard_params(cpu, 0, "bfloat16", 1 << 16)[0]
    store = dict(data)
    for k in dev:
        if dev[k].numel():
            dev[k].view(-1)[::97] += 0.5
            cpu[k].view(-1)[::97] += 0.5
    own2, data2, enc = pub.part(dev, 1, store.__getitem__)
    ref2, ref_data2 = shard_params(cpu, 1, "bfloat16", 1 << 16)
    assert own2 == ref2 and all(bytes(b) == bytes(ref_data2[h]) for h, b in data2.items())
    assert pub.host_bytes < 0.1 * sum(len(b) for b in data2.values()) and all(enc.values())
