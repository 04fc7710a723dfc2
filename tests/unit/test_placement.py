"""The pure placement policy, the shedding plan and the elastic scaler's decision."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose.runtime.placement import InFlight, RolloutTask, WorkerSlot, fair_order, place, plan_shed
from rose.config import ElasticConfig
from rose.runtime.placement.elastic import elastic_target

workers_st = st.lists(
    st.builds(WorkerSlot, address=st.sampled_from([f"w{i}" for i in range(8)]),
              role=st.sampled_from(["dedicated", "serving"]), slots=st.integers(0, 40), used=st.integers(0, 40),
              weight_version=st.integers(-1, 3)),
    max_size=8, unique_by=lambda w: w.address)
tasks_st = st.lists(
    st.builds(RolloutTask, key=st.uuids().map(str), width=st.integers(1, 12), min_version=st.integers(0, 3),
              group=st.sampled_from(["a/0", "a/1", "b/0"]),
              affinity=st.one_of(st.none(), st.sampled_from([f"w{i}" for i in range(8)]))),
    max_size=40, unique_by=lambda t: t.key)


@settings(max_examples=300, deadline=None)
@given(workers_st, tasks_st, st.sampled_from(["rose", "fixed", "elastic"]))
def test_never_beyond_slots_and_never_behind(workers, tasks, policy):
    out = place(tasks, workers, policy)
    by_key = {t.key: t for t in tasks}
    by_addr = {w.address: w for w in workers}
    assert len({a.key for a in out}) == len(out)  # each task once
    load = {}
    for a in out:
        w, t = by_addr[a.worker], by_key[a.key]
        assert w.weight_version >= t.min_version
        assert policy == "rose" or w.role == "dedicated"
        load[a.worker] = load.get(a.worker, 0) + t.width
    for addr, n in load.items():
        assert by_addr[addr].used + n <= by_addr[addr].slots


@settings(max_examples=300, deadline=None)
@given(workers_st, tasks_st)
def test_dedicated_preferred(workers, tasks):
    """No task lands on a serving worker while a dedicated worker that could take it (as placed so far)
    had room: replaying the assignments in order, each serving choice had no dedicated alternative."""
    tasks = [t for t in tasks if t.affinity is None]
    out = place(tasks, workers)
    by_key = {t.key: t for t in tasks}
    free = {w.address: w.free for w in workers}
    for a in out:
        t = by_key[a.key]
        if a.reason == "serving":
            assert not any(w.role == "dedicated" and w.weight_version >= t.min_version and free[w.address] >= t.width
                           for w in workers)
        free[a.worker] -= t.width


@settings(max_examples=300, deadline=None)
@given(workers_st, tasks_st)
def test_affinity_honoured_when_feasible(workers, tasks):
    out = place(tasks, workers)
    by_key = {t.key: t for t in tasks}
    by_addr = {w.address: w for w in workers}
    free = {w.address: w.free for w in workers}
    placed = {a.key for a in out}
    for a in out:
        t = by_key[a.key]
        w = by_addr.get(t.affinity)
        if w is not None and w.weight_version >= t.min_version and free[w.address] >= t.width:
            assert a.worker == t.affinity
        free[a.worker] -= t.width
    # a task left waiting had no worker with room at its turn (checked coarsely: with room now, nothing fits)
    for t in tasks:
        if t.key not in placed:
            assert not any(w.weight_version >= t.min_version and free[w.address] >= t.width for w in workers
                           if w.role in ("dedicated", "serving"))


@settings(max_examples=200, deadline=None)
@given(workers_st, tasks_st)
def test_work_conserving_for_unit_width(workers, tasks):
    """With width-1 tasks, placement stops only when no qualifying worker has a free slot."""
    tasks = [RolloutTask(t.key, 1, t.min_version, t.group) for t in tasks]
    out = place(tasks, workers)
    free = {w.address: w.free for w in workers}
    for a in out:
        free[a.worker] -= 1
    placed = {a.key for a in out}
    for t in tasks:
        if t.key not in placed:
            assert all(free[w.address] < 1 for w in workers if w.weight_version >= t.min_version)


def test_spreads_over_dedicated_then_fills_serving():
    workers = [WorkerSlot("d0", "dedicated", 16, weight_version=0), WorkerSlot("d1", "dedicated", 16, weight_version=0),
               WorkerSlot("s0", "serving", 16, weight_version=0)]
    out = place([RolloutTask(f"t{i}", 8) for i in range(6)], workers)
    assert [a.worker for a in out] == ["d0", "d1", "d0", "d1", "s0", "s0"]


def test_fixed_never_uses_serving_workers():
    out = place([RolloutTask("t", 1)], [WorkerSlot("s0", "serving", 16, weight_version=0)], "fixed")
    assert out == []


def test_groups_take_turns():
    tasks = [RolloutTask(f"a{i}", 1, group="a") for i in range(3)] + [RolloutTask("b0", 1, group="b")]
    assert [t.key for t in fair_order(tasks)] == ["a0", "b0", "a1", "a2"]
    out = place(tasks, [WorkerSlot("d", "dedicated", 2, weight_version=0)])
    assert [a.key for a in out] == ["a0", "b0"]


def test_wide_task_waits_narrow_one_fits():
    workers = [WorkerSlot("d", "dedicated", 4, weight_version=0)]
    out = place([RolloutTask("wide", 10), RolloutTask("narrow", 2)], workers)
    assert [(a.key, a.worker) for a in out] == [("narrow", "d")]


def test_behind_worker_is_skipped():
    workers = [WorkerSlot("old", "dedicated", 16, weight_version=2), WorkerSlot("new", "serving", 16, weight_version=3)]
    assert [a.worker for a in place([RolloutTask("t", 1, min_version=3)], workers)] == ["new"]
    assert place([RolloutTask("t", 1, min_version=4)], workers) == []


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown placement policy 'best'.*rose"):
        place([], [], "best")


def test_bad_width():
    with pytest.raises(ValueError, match="width"):
        RolloutTask("t", 0)


@given(st.lists(st.tuples(st.integers(1, 8), st.floats(0, 100)), max_size=12), st.integers(0, 40))
def test_plan_shed_fits_and_sheds_newest(items, slots):
    running = [InFlight(f"k{i}", w, t) for i, (w, t) in enumerate(items)]
    shed = set(plan_shed(running, slots))
    kept = [r for r in running if r.key not in shed]
    assert sum(r.width for r in kept) <= slots or not kept
    if shed:  # everything shed is at least as new as everything kept
        assert min(r.placed_at for r in running if r.key in shed) >= max((r.placed_at for r in kept), default=-1)
    if sum(r.width for r in running) <= slots:
        assert not shed


@given(st.lists(st.tuples(st.integers(1, 8), st.floats(0, 100), st.integers(0, 2)), max_size=12), st.integers(0, 40),
       st.lists(st.tuples(st.integers(-4, 16), st.integers(0, 2)), max_size=3), st.integers(0, 12))
def test_plan_shed_gives_back_only_what_other_workers_have_room_for(items, slots, others, held):
    running = [InFlight(f"k{i}", w, t, v) for i, (w, t, v) in enumerate(items)]
    workers = [WorkerSlot(f"w{i}", "dedicated", max(free, 0), max(-free, 0), v) for i, (free, v) in enumerate(others)]
    shed = plan_shed(running, slots, workers, held)
    assert len(set(shed)) == len(shed)
    # what is shed fits the others' room (held taken first), each task on one worker at its version
    room = _room_after_held(workers, held)
    for r in sorted((r for r in running if r.key in shed), key=lambda r: -r.width):
        fits = [i for i, (f, v) in enumerate(room) if f >= r.width and v >= r.min_version]
        assert fits, (r, room)
    for v in range(3):  # no more shed at a version than the room at or above it
        assert (sum(r.width for r in running if r.key in shed and r.min_version >= v)
                <= sum(f for f, fv in room if fv >= v))
    if not shed and sum(r.width for r in running) > slots:  # over, and kept: nothing fits anywhere
        assert not any(f >= r.width and v >= r.min_version for r in running for f, v in room)
    if sum(r.width for r in running) <= slots:
        assert not shed


def _room_after_held(workers, held):
    room = sorted(((w.free, w.weight_version) for w in workers if w.free > 0), reverse=True)
    out = []
    for f, v in room:
        take = min(f, held)
        out.append((f - take, v))
        held -= take
    return out


def test_elastic_target():
    cfg = ElasticConfig(max_extra=3, worker_slots=10, idle_release_s=5)
    assert elastic_target(0, 0, 0, 0.0, cfg) == 0
    assert elastic_target(25, 0, 0, 0.0, cfg) == 3  # three workers cover 25 sequences
    assert elastic_target(25, 0, 1, 0.0, cfg) == 3  # one already on its way covers 10 of them
    assert elastic_target(5, 0, 1, 0.0, cfg) == 1  # ...or all of them
    assert elastic_target(100, 1, 0, 0.0, cfg) == 3  # capped
    assert elastic_target(0, 2, 0, 1.0, cfg) == 2  # kept while not idle long
    assert elastic_target(0, 2, 0, 6.0, cfg) == 0  # given back after the grace


def test_plan_migrate_moves_the_oldest_serving_groups_to_the_freest_dedicated_workers():
    from rose.runtime.placement.policy import Running, plan_migrate
    workers = [WorkerSlot("d1", "dedicated", 16, 8), WorkerSlot("d2", "dedicated", 16, 0),
               WorkerSlot("s1", "serving", 32, 24)]
    running = [Running("new", "s1", 8, placed_at=5.0), Running("old", "s1", 8, placed_at=1.0),
               Running("mid", "s1", 8, placed_at=3.0), Running("on-ded", "d1", 8, placed_at=0.0)]
    out = plan_migrate(running, workers, waiting=0)
    # "new" stays: d1 would run 16 sequences, more than the 8 left on s1 (a bigger batch steps it slower)
    assert [(a.key, a.worker, a.reason) for a in out] == [("old", "d2", "migrate"), ("mid", "d2", "migrate")]
    assert plan_migrate(running, workers, waiting=1) == []  # waiting work comes first
    # the freest dedicated worker is too busy for it: a less free, idle one takes it
    busy_free = [WorkerSlot("d1", "dedicated", 64, 32), WorkerSlot("d2", "dedicated", 16, 0),
                 WorkerSlot("s1", "serving", 32, 16)]
    assert [(a.key, a.worker) for a in plan_migrate([Running("g", "s1", 8, 1.0)], busy_free, 0)] == [("g", "d2")]
    assert plan_migrate(running, [WorkerSlot("s1", "serving", 32, 24)], waiting=0) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 16), st.floats(0, 100)), max_size=30),
       st.lists(st.integers(0, 64), min_size=1, max_size=5))
def test_plan_migrate_never_overfills_a_dedicated_worker_nor_moves_a_dedicated_task(tasks, frees):
    from rose.runtime.placement.policy import Running, plan_migrate
    running = [Running(f"t{i}", f"s{w}" if i % 3 else f"d{w % len(frees)}", width, at)
               for i, (w, width, at) in enumerate(tasks)]
    used = {}
    for r in running:
        used[r.worker] = used.get(r.worker, 0) + r.width
    workers = [WorkerSlot(f"d{i}", "dedicated", f + used.get(f"d{i}", 0), used.get(f"d{i}", 0))
               for i, f in enumerate(frees)]
    workers += [WorkerSlot(f"s{i}", "serving", 256, used.get(f"s{i}", 0)) for i in range(5)]
    out = plan_migrate(running, workers, waiting=0)
    width = {r.key: r.width for r in running}
    origin = {r.key: r.worker for r in running}
    for w in workers:
        if w.role == "dedicated":
            assert sum(width[a.key] for a in out if a.worker == w.address) <= w.free
    for i, a in enumerate(out):  # each group lands in a batch no larger than the one it left
        before = out[:i + 1]
        dst = used.get(a.worker, 0) + sum(width[b.key] for b in before if b.worker == a.worker)
        src = used[origin[a.key]] - sum(width[b.key] for b in out[:i] if origin[b.key] == origin[a.key])
        assert dst <= src
    assert all(origin[a.key].startswith("s") and a.worker.startswith("d") for a in out)
    assert len({a.key for a in out}) == len(out)
