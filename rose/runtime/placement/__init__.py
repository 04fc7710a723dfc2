"""Rollout placement: pure decisions (`policy`, `elastic`) that `rose.runtime.scheduler` acts on."""
from rose.runtime.placement.policy import (
                                           POLICIES,
                                           Assignment,
                                           InFlight,
                                           RolloutTask,
                                           WorkerSlot,
                                           fair_order,
                                           place,
                                           plan_shed,
)

__all__ = ["POLICIES", "Assignment", "InFlight", "RolloutTask", "WorkerSlot", "fair_order", "place", "plan_shed"]
