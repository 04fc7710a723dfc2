"""The placement book on its own: events in, records out, no Dask and no clock."""
import ast
import inspect

from hypothesis import given
from hypothesis import strategies as st

from rose.runtime.placement import Assignment, RolloutTask
from rose.runtime.protocol import WorkerReport, group_of, resume_key
from rose.runtime.scheduler import book as book_module
from rose.runtime.scheduler.book import Dispatch, PlacementBook, Shed

D, S, T = "tcp://d", "tcp://s", "tcp://t"  # a dedicated worker, a serving worker, the trainer
RUNNING = {D, S, T}


def make_book(*reports: WorkerReport, policy="rose", shed_after_s=0.5, migrate=False) -> PlacementBook:
    book = PlacementBook(policy, shed_after_s, now=0.0, migrate=migrate)
    for r in reports:
        book.on_report(r.worker, r, 0.0, RUNNING, f"join-{r.worker}")
    return book


def dedicated(slots=16, **kw) -> WorkerReport:
    return WorkerReport(D, "dedicated", slots=slots, weight_version=0, **kw)


def serving(slots=16) -> WorkerReport:
    return WorkerReport(S, "serving", slots=slots, weight_version=0)


def run_task(book: PlacementBook, key: str, addr: str, width: int, now: float) -> None:
    book.on_parked([RolloutTask(key, width)], now, f"park-{key}")
    book.on_started(key, addr, now, f"start-{key}")


def test_the_book_imports_nothing_of_dask():
    tree = ast.parse(inspect.getsource(book_module))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in names if m.split(".")[0] in ("dask", "distributed", "tornado")}


def test_parked_tasks_go_to_the_dedicated_worker_first_then_to_serving():
    book = make_book(dedicated(slots=8), serving(slots=8), WorkerReport(T, "trainer"))
    tasks = [RolloutTask(f"r{i}", 4) for i in range(3)]
    assert book.on_parked(tasks, 1.0, "graph-1") == [Dispatch("graph-1")]
    got = book.dispatch([t.key for t in tasks], 1.0, RUNNING, "dispatch-1")
    assert got == [Assignment("r0", D, "dedicated"), Assignment("r1", D, "dedicated"), Assignment("r2", S, "serving")]
    assert book.counts[f"dispatched@{D}"] == 2 and book.counts[f"dispatched@{S}"] == 1


def test_the_fixed_policy_leaves_serving_workers_alone():
    book = make_book(dedicated(slots=4), serving(slots=8), policy="fixed")
    book.on_parked([RolloutTask("a", 4), RolloutTask("b", 4)], 1.0, "graph-1")
    assert book.dispatch(["a", "b"], 1.0, RUNNING, "dispatch-1") == [Assignment("a", D, "dedicated")]


def test_no_dispatch_to_a_worker_dask_does_not_count_as_running():
    book = make_book(dedicated(), serving())
    book.on_parked([RolloutTask("a", 4)], 1.0, "graph-1")
    assert book.dispatch(["a"], 1.0, {S}, "dispatch-1") == [Assignment("a", S, "serving")]


def test_only_a_change_of_slots_or_weights_asks_for_a_dispatch():
    book = make_book(dedicated(slots=16))
    assert book.on_report(D, dedicated(slots=16, slo_met=None), 1.0, RUNNING, "same") == []
    assert book.on_report(D, dedicated(slots=32), 1.0, RUNNING, "more") == [Dispatch("more")]
    newer = WorkerReport(D, "dedicated", slots=32, weight_version=1)
    assert book.on_report(D, newer, 1.0, RUNNING, "weights") == [Dispatch("weights")]


def test_a_capacity_drop_sheds_the_newest_tasks_at_once():
    book = make_book(dedicated(slots=16), serving(slots=8), shed_after_s=0.0)
    for i, key in enumerate(["old", "mid", "new"]):
        run_task(book, key, D, 4, now=1.0 + i)
    out = book.on_report(D, dedicated(slots=4), 5.0, RUNNING, "drop")
    assert out == [Dispatch("drop"), Shed(D, ("new", "mid"), "over-slots")]
    assert book.shedding[D] == {"new", "mid"} and book.counts[f"shed@{D}"] == 2


def test_over_its_slots_a_worker_sheds_only_after_shed_after_s():
    book = make_book(dedicated(slots=16), serving(slots=16), shed_after_s=0.5)
    run_task(book, "a", D, 8, now=1.0)
    run_task(book, "b", D, 8, now=2.0)
    assert book.on_report(D, dedicated(slots=8), 10.0, RUNNING, "drop") == [Dispatch("drop")]  # over since 10.0
    assert book.tick(10.4, RUNNING, "tick-1") == []
    assert book.tick(10.5, RUNNING, "tick-2") == [Shed(D, ("b",), "over-slots")]
    assert book.tick(11.0, RUNNING, "tick-3") == []  # asked once: "b" is on its way back
    assert [(s.time, s.worker, s.slots, s.used) for s in book.history][-2:] == [(11.0, D, 8, 16), (11.0, S, 16, 0)]


def test_back_under_its_slots_a_worker_starts_over():
    book = make_book(dedicated(slots=16), serving(slots=16), shed_after_s=0.5)
    run_task(book, "a", D, 16, now=1.0)
    book.on_report(D, dedicated(slots=8), 10.0, RUNNING, "drop")
    book.on_report(D, dedicated(slots=16), 10.3, RUNNING, "rise")
    assert book.tick(10.4, RUNNING, "tick-1") == []
    book.on_report(D, dedicated(slots=8), 10.6, RUNNING, "drop-again")
    assert book.tick(11.0, RUNNING, "tick-2") == []  # over since 10.6, not 10.0
    assert book.tick(11.1, RUNNING, "tick-3") == [Shed(D, ("a",), "over-slots")]


def test_over_its_slots_a_worker_keeps_what_no_other_worker_has_room_for():
    book = make_book(dedicated(slots=8), serving(slots=16), shed_after_s=0.0)
    run_task(book, "d1", D, 8, now=1.0)
    run_task(book, "s1", S, 8, now=1.0)
    run_task(book, "s2", S, 8, now=2.0)
    assert book.on_report(S, serving(slots=8), 3.0, RUNNING, "dip") == [Dispatch("dip")]  # the dedicated one is full
    assert book.tick(3.5, RUNNING, "tick-1") == [] and book.counts[f"shed@{S}"] == 0
    book.on_finished("d1", "memory", "d1-done")  # room appears: the newest goes there
    assert book.tick(4.0, RUNNING, "tick-2") == [Shed(S, ("s2",), "over-slots")]


def test_room_elsewhere_counts_what_earlier_sheds_are_bringing_and_the_weight_version():
    book = make_book(dedicated(slots=8), serving(slots=24), shed_after_s=0.0)
    for i, key in enumerate(["s1", "s2", "s3"]):
        run_task(book, key, S, 8, now=1.0 + i)
    book.on_report(S, serving(slots=0), 5.0, RUNNING, "dip")
    assert book.shedding[S] == {"s3"}  # the dedicated worker has room for one of three
    assert book.tick(5.5, RUNNING, "tick") == []  # that room is s3's until its continuation is placed
    behind = make_book(WorkerReport(D, "dedicated", slots=8, weight_version=0), serving(slots=16), shed_after_s=0.0)
    behind.on_parked([RolloutTask("new", 8, min_version=1)], 1.0, "park")
    behind.on_started("new", S, 1.0, "start")
    behind.on_report(S, serving(slots=0), 2.0, RUNNING, "dip")
    assert not behind.shedding[S]  # the worker with room is behind the task's weights


def test_a_colocated_worker_has_no_slots_while_training_and_sheds_at_once():
    book = make_book(dedicated(slots=16, colocated=True), serving(slots=16), shed_after_s=60.0)
    run_task(book, "a", D, 8, now=1.0)
    run_task(book, "b", S, 8, now=1.0)
    assert book.on_train_started("train-1", 2.0, RUNNING, "train-starts") == [Shed(D, ("a",), "training")]
    assert book.slot(D, RUNNING).slots == 0 and book.slot(S, RUNNING).slots == 16
    book.on_parked([RolloutTask("c", 4)], 3.0, "graph-2")
    assert book.dispatch(["c"], 3.0, RUNNING, "dispatch-1") == [Assignment("c", S, "serving")]
    assert book.on_train_finished("train-1", "train-ends") == [Dispatch("train-ends")]
    assert book.slot(D, RUNNING).slots == 16 and book.state(4.0, RUNNING, 0)["training"] == []


def test_a_worker_that_is_not_colocated_ignores_training():
    book = make_book(dedicated(slots=16), shed_after_s=60.0)
    run_task(book, "a", D, 8, now=1.0)
    assert book.on_train_started("train-1", 2.0, RUNNING, "train-starts") == []
    assert book.slot(D, RUNNING).slots == 16


def test_an_unknown_role_is_refused_once_with_an_event_naming_it():
    book = make_book()
    gpu = WorkerReport(T, "gpu", slots=4)
    assert book.on_report(T, gpu, 1.0, RUNNING, "report-1") == []
    assert book.on_report(T, gpu, 2.0, RUNNING, "report-2") == []
    assert T not in book.workers and "unknown role 'gpu'" in book.refused[T]
    refusals = [e for e in book.events if e.kind == "refused"]
    assert len(refusals) == 1 and refusals[0].worker == T and "'gpu'" in refusals[0].detail


def test_a_malformed_report_is_refused_like_an_unknown_role():
    book = make_book()
    book.on_bad_report(T, "a worker report needs a 'role'", 1.0, "report-1")
    assert "malformed report" in book.refused[T] and T not in book.workers
    assert [e.stimulus_id for e in book.events if e.kind == "refused"] == ["report-1"]


def test_a_late_report_of_a_worker_that_left_is_ignored_until_it_registers_again():
    book = make_book(dedicated(slots=16))
    run_task(book, "a", D, 8, now=1.0)
    assert book.on_worker_removed(D, 2.0, "worker-left") == [Dispatch("worker-left")]
    assert book.events[-1].kind == "removed" and "1 rollout tasks to re-place" in book.events[-1].detail
    assert book.on_report(D, dedicated(slots=16), 3.0, RUNNING, "late") == [] and D not in book.workers
    book.on_worker_added(D, "worker-back")
    assert book.on_report(D, dedicated(slots=16), 4.0, RUNNING, "report") == [Dispatch("report")]
    assert D in book.workers


def test_a_finished_shed_task_counts_as_shed_returned():
    book = make_book(dedicated(slots=16), serving(slots=16), shed_after_s=0.0)
    run_task(book, "a", D, 8, now=1.0)
    run_task(book, "b", D, 8, now=2.0)
    book.on_report(D, dedicated(slots=8), 3.0, RUNNING, "drop")
    assert book.on_finished("b", "memory", "b-done") == [Dispatch("b-done")]
    book.on_finished("a", "memory", "a-done")
    assert book.counts[f"shed-returned@{D}"] == 1 and book.counts[f"memory@{D}"] == 2
    assert not book.shedding[D] and not book.where and not book.inflight[D]
    book.on_forgotten("a")
    assert "a" not in book.tasks and "b" in book.tasks


def test_a_shed_task_that_yields_frees_its_slots_while_it_waits_for_its_group():
    """A shed group's task stays running at Dask while its continuation runs elsewhere; its slots are
    free from its word (`on_yielded`), and its end later frees nothing twice."""
    book = make_book(dedicated(slots=16), serving(slots=8), shed_after_s=0.0)
    run_task(book, "a", D, 8, now=1.0)
    run_task(book, "b", D, 8, now=1.5)
    assert book.on_report(D, dedicated(slots=8), 2.0, RUNNING, "drop")[-1] == Shed(D, ("b",), "over-slots")
    assert book.on_yielded("b", S, "wrong-worker") == [] and book.where["b"] == D  # a word from elsewhere
    assert book.on_yielded("b", D, "b-yielded") == [Dispatch("b-yielded")]
    assert book.counts[f"shed-returned@{D}"] == 1 and book.counts[f"yielded@{D}"] == 1
    assert set(book.inflight[D]) == {"a"} and not book.shedding[D] and book.slot(D, RUNNING).used == 8
    book.on_parked([RolloutTask(resume_key("b", 1), 5)], 2.5, "park-resume")
    assert book.dispatch([resume_key("b", 1)], 2.5, RUNNING, "d") == [Assignment(resume_key("b", 1), S, "serving")]
    assert book.on_finished("b", "memory", "b-done") == [Dispatch("b-done")]  # its group is done
    assert book.counts[f"memory@{D}"] == 0 and set(book.inflight[D]) == {"a"}
    assert book.on_yielded("b", D, "late") == []


def test_tasks_waiting_with_no_rollout_worker_warn_once():
    book = make_book(WorkerReport(T, "trainer"))
    book.on_parked([RolloutTask("a", 4)], 1.0, "graph-1")
    assert book.dispatch(["a"], 1.0, RUNNING, "dispatch-1") == []
    assert book.dispatch(["a"], 2.0, RUNNING, "dispatch-2") == []
    assert "no rollout-capable worker" in book.waiting_warning
    assert [e.stimulus_id for e in book.events if e.kind == "warning"] == ["dispatch-1"]
    book.on_report(D, dedicated(), 3.0, RUNNING, "join")
    assert book.dispatch(["a"], 3.0, RUNNING, "dispatch-3") == [Assignment("a", D, "dedicated")]
    assert book.waiting_warning is None


def test_each_logged_event_names_its_stimulus():
    book = make_book(dedicated(slots=16, colocated=True), serving(slots=8), shed_after_s=0.0)
    run_task(book, "a", D, 8, now=1.0)
    run_task(book, "b", D, 8, now=2.0)
    book.on_report(D, dedicated(slots=8, colocated=True), 3.0, RUNNING, "drop")
    book.on_train_started("train-1", 4.0, RUNNING, "train-starts")
    book.on_report(T, WorkerReport(T, "gpu"), 5.0, RUNNING, "gpu-report")
    book.on_worker_removed(D, 6.0, "worker-left")
    assert [(e.kind, e.stimulus_id) for e in book.events] == [
        ("joined", f"join-{D}"), ("joined", f"join-{S}"), ("shed", "drop"), ("training", "train-starts"), ("shed", "train-starts"),
        ("refused", "gpu-report"), ("removed", "worker-left")]
    assert book.state(7.0, RUNNING, 0)["events"][-1][1:3] == ("removed", D)


def test_elastic_demand_counts_sequences_no_dedicated_worker_has_room_for():
    book = make_book(dedicated(slots=8), serving(slots=64))
    book.on_parked([RolloutTask(k, 4) for k in "abc"], 1.0, "graph-1")
    assert book.elastic_demand(["a", "b", "c"], 5.0, RUNNING) == {"waiting_seqs": 4, "idle_s": 4.0}


workers = st.lists(st.tuples(st.sampled_from(["dedicated", "serving", "trainer"]), st.integers(0, 16),
                             st.integers(-1, 2), st.booleans()), min_size=0, max_size=5)
waiting = st.lists(st.tuples(st.integers(1, 8), st.integers(0, 2)), min_size=0, max_size=12)


@given(workers, waiting, st.sampled_from(["rose", "fixed", "elastic"]))
def test_dispatch_fits_free_slots_and_only_running_rollout_workers(ws, ts, policy):
    book = PlacementBook(policy, now=0.0)
    running = set()
    for i, (role, slots, version, up) in enumerate(ws):
        addr = f"tcp://w{i}"
        book.on_report(addr, WorkerReport(addr, role, slots=slots, weight_version=version), 0.0, {addr}, "join")
        running |= {addr} if up else set()
    if ws:  # one worker already runs a task
        run_task(book, "busy", "tcp://w0", 4, now=0.0)
    tasks = [RolloutTask(f"t{i}", width, version) for i, (width, version) in enumerate(ts)]
    book.on_parked(tasks, 1.0, "graph")
    free = {w.address: w.free for w in book.view(running)}
    got = book.dispatch([t.key for t in tasks], 1.0, running, "dispatch")
    width = {t.key: t.width for t in tasks}
    for a in got:
        assert a.worker in running and book.workers[a.worker].role != "trainer"
        assert policy == "rose" or book.workers[a.worker].role == "dedicated"
        assert book.workers[a.worker].weight_version >= book.tasks[a.key].min_version
    for addr in {a.worker for a in got}:
        assert sum(width[a.key] for a in got if a.worker == addr) <= free[addr]


def test_the_tail_moves_off_a_serving_worker_once_a_dedicated_worker_has_room():
    book = make_book(dedicated(slots=16), serving(slots=32), migrate=True)
    run_task(book, "a", D, 16, now=1.0)
    run_task(book, "old", S, 8, now=2.0)
    run_task(book, "new", S, 8, now=3.0)
    assert book.tick(4.0, RUNNING, "t1") == []  # the dedicated worker is full
    book.on_finished("a", "memory", "a-done")
    assert book.tick(5.0, RUNNING, "t2", waiting=1) == []  # tasks wait: they take the room first
    # oldest first; "new" stays, as the dedicated worker would then batch more than the serving one
    assert book.tick(5.0, RUNNING, "t3") == [Shed(S, ("old",), "migrate")]
    assert book.counts[f"migrated@{S}"] == 1 and book.events[-1].kind == "migrate"
    assert book.tick(6.0, RUNNING, "t4") == []  # asked once
    book.on_finished("old", "memory", "old-shed")  # its continuation is on its way
    assert book.tick(6.5, RUNNING, "t5") == []  # the room stays held for it
    book.on_parked([RolloutTask("old-resume1", 8)], 7.0, "old-back")
    assert book.dispatch(["old-resume1"], 7.0, RUNNING, "d1") == [Assignment("old-resume1", D, "dedicated")]


def test_the_tail_moves_as_soon_as_a_train_step_gives_a_colocated_worker_its_slots_back():
    book = make_book(dedicated(slots=16, colocated=True), serving(slots=32), migrate=True)
    book.on_train_started("train-1", 1.0, RUNNING, "train-starts")
    run_task(book, "old", S, 8, now=1.5)  # placed on the serving worker while the trainer trains
    run_task(book, "new", S, 8, now=1.6)
    assert book.on_room(2.0, RUNNING, "r0", waiting=0) == []  # still training: no room
    book.on_train_finished("train-1", "train-ends")
    assert book.on_room(2.1, RUNNING, "r1", waiting=1) == []  # tasks wait: they take the room first
    assert book.on_room(2.1, RUNNING, "r2", waiting=0) == [Shed(S, ("old",), "migrate")]
    assert book.on_room(2.2, RUNNING, "r3", waiting=0) == []  # asked once; "new" stays (batch no larger)
    off = make_book(dedicated(slots=16, colocated=True), serving(slots=32))
    run_task(off, "old", S, 8, now=1.5)
    assert off.on_room(2.1, RUNNING, "r1", waiting=0) == []  # migration off


def test_a_move_holds_its_room_so_one_free_slot_draws_one_task():
    book = make_book(dedicated(slots=8), serving(slots=32), migrate=True)
    run_task(book, "b", S, 8, now=1.0)
    run_task(book, "c", S, 8, now=2.0)
    assert book.tick(3.0, RUNNING, "t1") == [Shed(S, ("b",), "migrate")]
    assert book.tick(3.5, RUNNING, "t2") == []
    book.on_finished("b", "erred", "b-failed")  # no continuation will come: the room is free again
    assert book.tick(4.0, RUNNING, "t3") == [Shed(S, ("c",), "migrate")]


def test_nothing_moves_with_migration_off_or_under_the_fixed_policy():
    assert not PlacementBook().migrate  # off unless asked for
    for book in (PlacementBook("rose", 0.5, now=0.0), PlacementBook("fixed", 0.5, now=0.0, migrate=True)):
        for r in (dedicated(slots=16), serving(slots=16)):
            book.on_report(r.worker, r, 0.0, RUNNING, "join")
        if book.policy == "fixed":
            book.inflight[S]["b"] = book_module.InFlight("b", 8, 1.0)  # (fixed never places there)
            book.tasks["b"], book.where["b"] = RolloutTask("b", 8), S
        else:
            run_task(book, "b", S, 8, now=1.0)
        assert book.tick(2.0, RUNNING, "t") == []


def test_a_moved_continuation_frees_the_room_held_for_its_group():
    book = make_book(dedicated(slots=8), serving(slots=32), migrate=True)
    run_task(book, "g", D, 8, now=1.0)
    run_task(book, "h-resume1", S, 8, now=2.0)  # a continuation of group h, running on the serving worker
    book.on_finished("g", "memory", "g-done")
    assert book.tick(3.0, RUNNING, "t1") == [Shed(S, ("h-resume1",), "migrate")]
    book.on_finished("h-resume1", "memory", "h-shed")
    book.on_parked([RolloutTask("h-resume2", 8)], 4.0, "h-back")  # its next continuation: room no longer held
    assert book.migrating == {}
    assert resume_key("h", 2) == "h-resume2" and group_of("h-resume2") == group_of("h") == "h"
