"""The run's action order, in both modes, as plain lists."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rose.schedule import Action, plan_run


def _at(plan, kind, step):
    return plan.index(Action(kind, step))


def test_synchronous_steps_do_not_overlap():
    plan = plan_run(3, 0)
    assert [(a.kind, a.step) for a in plan[:6]] == [("start", 0), ("train", 0), ("sync", 0), ("wait", 0),
                                                     ("trained", 0), ("finish", 0)]
    for k in range(1, 3):
        assert _at(plan, "finish", k - 1) < _at(plan, "start", k)


def test_asynchronous_next_rollouts_overlap_training():
    plan = plan_run(3, 1)
    # step 1's rollouts start once step 0's train task is submitted, before step 0's sync
    assert _at(plan, "train", 0) < _at(plan, "start", 1) < _at(plan, "sync", 0)
    # step 0's sync waits for step 1's rollouts and step 0's training; step 1 trains after it is submitted
    assert _at(plan, "wait", 1) < _at(plan, "sync", 0) < _at(plan, "train", 1)
    assert _at(plan, "trained", 0) < _at(plan, "sync", 0)
    # one step ahead, never two: step 2 starts only after step 0 is finished
    assert _at(plan, "finish", 0) < _at(plan, "start", 2)
    assert plan[-2:] == [Action("sync", 2), Action("finish", 2)]


def test_asynchronous_steps_started_on_the_sync():
    plan = plan_run(4, 1, start_on_sync=True)
    # step 1 as without: once step 0's train task is submitted
    assert _at(plan, "train", 0) < _at(plan, "start", 1) < _at(plan, "wait", 1) < _at(plan, "sync", 0)
    for k in (2, 3):
        # step k starts once the sync of the weights it rolls out on (step k - 2's) and step k - 1's train
        # task are submitted, before step k - 2 is finished
        assert _at(plan, "sync", k - 2) < _at(plan, "train", k - 1) < _at(plan, "start", k) < _at(plan, "finish", k - 2)
        # and after step k - 1's rollouts: still one step ahead, never two
        assert _at(plan, "wait", k - 1) < _at(plan, "start", k)
    assert plan_run(4, 0, start_on_sync=True) == plan_run(4, 0)  # synchronous steps have no sync to start on


@given(st.integers(1, 12), st.sampled_from([0, 1]), st.booleans())
def test_every_step_runs_each_action_once_in_order(steps, staleness, start_on_sync):
    plan = plan_run(steps, staleness, start_on_sync=start_on_sync)
    assert len(plan) == len(set(plan)) == 6 * steps
    for k in range(steps):
        assert _at(plan, "start", k) < _at(plan, "wait", k) < _at(plan, "finish", k)
        assert _at(plan, "start", k) < _at(plan, "train", k) < _at(plan, "sync", k) < _at(plan, "finish", k)
        assert _at(plan, "train", k) < _at(plan, "trained", k) < _at(plan, "finish", k)
        if k:  # steps finish in order; one train step at a time, each after the previous one's sync
            assert _at(plan, "finish", k - 1) < _at(plan, "finish", k)
            assert _at(plan, "trained", k - 1) < _at(plan, "train", k)
            assert _at(plan, "sync", k - 1) < _at(plan, "train", k)
        # the rollouts of step k run on the weights of every step whose sync was submitted before it
        # started: k - staleness of them (bounded staleness); started on the sync, the last of them may
        # not have finished yet
        synced_before = sum(_at(plan, "sync", j) < _at(plan, "start", k) for j in range(k))
        assert synced_before == max(0, k - staleness)
        finished_before = sum(_at(plan, "finish", j) < _at(plan, "start", k) for j in range(k))
        assert finished_before == max(0, k - staleness - (1 if start_on_sync and staleness and k >= 2 else 0))
        # weights never change under running rollouts: no sync is submitted between a start and its wait
        between = plan[_at(plan, "start", k):_at(plan, "wait", k)]
        assert not [a for a in between if a.kind == "sync" and a.step != k]


def test_bad_arguments():
    with pytest.raises(ValueError, match="staleness=2"):
        plan_run(3, 2)
    with pytest.raises(ValueError, match="steps=0"):
        plan_run(0, 0)


@given(st.integers(1, 12), st.integers(0, 11), st.sampled_from([0, 1]), st.booleans())
def test_a_resumed_plan_is_the_tail_of_a_shorter_run_shifted(steps, first, staleness, start_on_sync):
    if first >= steps:
        with pytest.raises(ValueError):
            plan_run(steps, staleness, first, start_on_sync)
        return
    plan = plan_run(steps, staleness, first, start_on_sync)
    assert {a.step for a in plan} == set(range(first, steps))
    assert [(a.kind, a.step - first) for a in plan] == [(a.kind, a.step) for a in
                                                        plan_run(steps - first, staleness, 0, start_on_sync)]
