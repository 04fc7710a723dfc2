"""The scheduler plugin's own bookkeeping, without processes: hook failures are counted and logged."""
import logging
from types import SimpleNamespace

import pytest

from rose.runtime.placement import InFlight, RolloutTask
from rose.runtime.scheduler.plugin import RoseScheduler


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown ROSE placement policy 'best'.*'rose', 'fixed', 'elastic'"):
        RoseScheduler(policy="best")


def test_a_failing_hook_is_logged_and_counted_not_raised(caplog):
    plugin = RoseScheduler()
    plugin.scheduler = SimpleNamespace(tasks={}, workers={}, loop=None)
    plugin.book.tasks["rose-rollout-x"] = RolloutTask("rose-rollout-x", 8)
    with caplog.at_level(logging.WARNING, logger="rose.scheduler"):
        # the scheduler has no such task: the hook fails inside
        plugin.transition("rose-rollout-x", "no-worker", "processing", stimulus_id="t")
    assert plugin.errors == 1 and "transition" in plugin.last_error and "KeyError" in plugin.last_error
    assert any(r.levelno >= logging.WARNING and "transition failed" in r.getMessage() for r in caplog.records)


def test_reports_of_unknown_roles_are_refused(caplog):
    plugin = RoseScheduler()
    plugin.scheduler = SimpleNamespace(tasks={}, workers={"tcp://w": object()}, running=set(), loop=None)
    with caplog.at_level(logging.ERROR, logger="rose.scheduler"):
        plugin.log_event("rose-capacity", {"worker": "tcp://w", "role": "gpu", "slots": 4})
    assert "unknown role 'gpu'" in plugin.book.refused["tcp://w"] and "tcp://w" not in plugin.book.workers
    assert plugin.errors == 0
    assert any("refusing worker tcp://w" in r.getMessage() for r in caplog.records)


def test_a_report_without_a_role_is_refused_not_counted_as_an_error():
    plugin = RoseScheduler()
    plugin.scheduler = SimpleNamespace(tasks={}, workers={"tcp://w": object()}, loop=None)
    plugin.log_event("rose-capacity", {"worker": "tcp://w", "slots": 4})
    assert "malformed report" in plugin.book.refused["tcp://w"] and "needs a 'role'" in plugin.book.refused["tcp://w"]
    assert "tcp://w" not in plugin.book.workers and plugin.errors == 0


def _plugin_with_workers(sent: list):
    plugin = RoseScheduler()
    d, s = object(), object()  # WorkerStates, as far as the plugin looks
    plugin.scheduler = SimpleNamespace(tasks={}, workers={"tcp://d": d, "tcp://s": s}, running={d, s}, unrunnable={},
                                       loop=SimpleNamespace(add_callback=lambda fn: None),
                                       worker_send=lambda addr, msg: sent.append((addr, msg)))
    plugin.log_event("rose-capacity", {"worker": "tcp://d", "role": "dedicated", "slots": 16, "colocated": True,
                                       "weight_version": 0})
    plugin.log_event("rose-capacity", {"worker": "tcp://s", "role": "serving", "slots": 16, "weight_version": 0})
    return plugin


def _slot(plugin, addr):
    return plugin.book.slot(addr, plugin.running())


def test_a_colocated_worker_yields_to_a_running_train_step_and_gets_its_slots_back():
    sent = []
    plugin = _plugin_with_workers(sent)
    plugin.book.inflight["tcp://d"]["rose-rollout-a"] = InFlight("rose-rollout-a", 8, 1.0)
    plugin.book.inflight["tcp://s"]["rose-rollout-b"] = InFlight("rose-rollout-b", 8, 1.0)
    plugin.update_graph(plugin.scheduler, tasks=["g-train-s1"], annotations={"rose-trains": {"g-train-s1": True}})
    assert _slot(plugin, "tcp://d").slots == 16  # submitted, not yet running: no effect

    plugin.transition("g-train-s1", "waiting", "processing", stimulus_id="t")
    assert _slot(plugin, "tcp://d").slots == 0 and _slot(plugin, "tcp://s").slots == 16
    # what the colocated worker runs is shed at once, without waiting out shed_after_s; nothing else is
    assert sent == [("tcp://d", {"op": "rose-shed", "keys": ["rose-rollout-a"], "migrate": False})]
    assert plugin.state()["training"] == ["g-train-s1"]

    plugin.transition("g-train-s1", "processing", "memory", stimulus_id="t")
    assert _slot(plugin, "tcp://d").slots == 16 and plugin.state()["training"] == []
    plugin.transition("g-train-s1", "memory", "forgotten", stimulus_id="t")
    assert not plugin.train_keys and plugin.errors == 0


def test_without_colocation_a_train_step_changes_nothing():
    sent = []
    plugin = _plugin_with_workers(sent)
    plugin.log_event("rose-capacity", {"worker": "tcp://d", "role": "dedicated", "slots": 16, "colocated": False,
                                       "weight_version": 0})
    plugin.update_graph(plugin.scheduler, tasks=["g-train-s1"], annotations={"rose-trains": {"g-train-s1": True}})
    plugin.transition("g-train-s1", "waiting", "processing", stimulus_id="t")
    assert _slot(plugin, "tcp://d").slots == 16 and sent == [] and plugin.errors == 0


def test_a_serving_worker_over_its_slots_sheds_to_room_elsewhere_and_its_continuation_keeps_no_affinity():
    sent = []
    plugin = _plugin_with_workers(sent)
    plugin.book.shed_after_s = 0.0
    plugin.book.inflight["tcp://s"]["rose-rollout-b"] = InFlight("rose-rollout-b", 8, 1.0)
    plugin.log_event("rose-capacity", {"worker": "tcp://s", "role": "serving", "slots": 4, "weight_version": 0})
    # the dedicated worker has room: the task goes there, and only a yield to training keeps affinity
    assert sent == [("tcp://s", {"op": "rose-shed", "keys": ["rose-rollout-b"], "migrate": True})]


def test_a_parked_rollout_keeps_its_width_and_version_when_a_later_graph_names_it_as_a_dependency():
    plugin = _plugin_with_workers([])
    key = "rose-rollout-guess-rollout-s2-g7"
    plugin.scheduler.tasks[key] = SimpleNamespace(state="no-worker", worker_restrictions=None, loose_restrictions=True)
    plugin.update_graph(plugin.scheduler, tasks=[key], annotations={
        "rose-role": {key: "rollout"}, "rose-width": {key: 8}, "weight_version": {key: 2}, "rose-group": {key: "g/2"}})
    # the step's finish tasks come as a second graph that names the rollout (no annotations for it)
    plugin.update_graph(plugin.scheduler, tasks=[key, "guess-rollout-s2-g7-done"], annotations={})
    t = plugin.book.tasks[key]
    assert (t.width, t.min_version, t.group) == (8, 2, "g/2")
    assert plugin.errors == 0


def _task(key, state, *waiting_on):
    return SimpleNamespace(key=key, state=state, waiting_on=list(waiting_on))  # a TaskState, as far as looked


def test_a_colocated_worker_takes_nothing_new_once_its_train_step_waits_only_for_scores():
    """A train task whose rollouts have all ended starts once their scores are in: rollouts a colocated
    worker took in between would be shed moments later (an asynchronous step's next rollouts can be
    placed in that window). Its other workers keep their slots, and running work is not shed for it."""
    sent = []
    plugin = _plugin_with_workers(sent)
    rollout = "rose-rollout-guess-rollout-s1-g0"
    plugin.book.tasks[rollout] = RolloutTask(rollout, 8)
    plugin.book.inflight["tcp://d"]["rose-rollout-a"] = InFlight("rose-rollout-a", 8, 1.0)
    plugin.update_graph(plugin.scheduler, tasks=["g-train-s1"], annotations={"rose-trains": {"g-train-s1": True}})
    ro = _task(rollout, "processing")
    score = _task("g-reward-s1-0", "waiting", ro)  # a chain: train <- reward <- rollout
    train = _task("g-train-s1", "waiting", score, _task("g-train-s0", "memory"))
    plugin.scheduler.tasks.update({t.key: t for t in (ro, score, train)})

    def slots():
        plugin._dispatch()
        return _slot(plugin, "tcp://d").slots, _slot(plugin, "tcp://s").slots

    assert slots() == (16, 16)  # its rollout still runs: the train step is not due
    ro.state, score.waiting_on, score.state = "memory", [], "processing"
    assert slots() == (0, 16)  # only the score is left
    assert sent == [] and plugin.errors == 0  # nothing shed for it: the train step's start sheds
    train.state, train.waiting_on = "processing", []
    plugin.transition("g-train-s1", "waiting", "processing", stimulus_id="t")
    plugin.transition("g-train-s1", "processing", "memory", stimulus_id="t")
    train.state = "memory"
    assert slots() == (16, 16) and plugin.errors == 0
