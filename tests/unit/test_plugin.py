"""The scheduler plugin's own bookkeeping, without processes: hook failures are counted and logged."""
import logging
from types import SimpleNamespace

import pytest

from rose.plugin import RoseScheduler
from rose.runtime.placement import RolloutTask


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown ROSE placement policy 'best'.*'rose', 'fixed', 'elastic'"):
        RoseScheduler(policy="best")


def test_a_failing_hook_is_logged_and_counted_not_raised(caplog):
    plugin = RoseScheduler()
    plugin.scheduler = SimpleNamespace(tasks={}, workers={}, loop=None)
    plugin.tasks["rose-rollout-x"] = RolloutTask("rose-rollout-x", 8)
    with caplog.at_level(logging.WARNING, logger="rose.plugin"):
        # the scheduler has no such task: the hook fails inside
        plugin.transition("rose-rollout-x", "no-worker", "processing", stimulus_id="t")
    assert plugin.errors == 1 and "transition" in plugin.last_error and "KeyError" in plugin.last_error
    assert any(r.levelno >= logging.WARNING and "transition failed" in r.getMessage() for r in caplog.records)


def test_reports_of_unknown_roles_are_refused(caplog):
    plugin = RoseScheduler()
    plugin.scheduler = SimpleNamespace(tasks={}, workers={"tcp://w": object()}, loop=None)
    with caplog.at_level(logging.ERROR, logger="rose.plugin"):
        plugin.log_event("rose-capacity", {"worker": "tcp://w", "role": "gpu", "slots": 4})
    assert "unknown role 'gpu'" in plugin.refused["tcp://w"] and "tcp://w" not in plugin.workers
    assert plugin.errors == 0
    assert any("refusing worker tcp://w" in r.getMessage() for r in caplog.records)
