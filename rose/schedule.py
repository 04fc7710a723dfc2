"""The order of a run's actions: a pure function of the number of steps and the staleness.

The runner interprets these actions one by one; nothing here touches a cluster, so both modes are
tested as plain lists (tests/unit/test_schedule.py).

- Synchronous (staleness 0): each step is started, trained and synced before the next starts, so its
  rollouts use the weights of the sync just before it.
- Asynchronous (staleness 1): step k+1 starts as soon as step k's train task is submitted, so its
  rollouts run on the weights from before step k's training while the trainer works. Step k's sync is
  submitted only after step k+1's rollouts are done (weights never change under a running trajectory,
  so every trajectory comes from one version) and once step k's train task is done (one trainer
  trains one step at a time); step k+1's train task right after it (the trainer publishes its
  version once that sync is done reading the previous one).
- Asynchronous, started on the sync (`start_on_sync`): step k+2 starts as soon as step k's sync is
  submitted rather than once step k has finished. Its rollout tasks need the weights that sync brings:
  the placement plugin places a rollout task only on an engine at its weight version, and a worker
  reports its version the moment it commits one, so they start as each engine swaps, without waiting
  for the sync's status to reach the driver, step k's bookkeeping and a new submission (from the sync's
  submission to the first rollout admitted, 80 ms against 102 on the Zen 5 host, 2026-12-05, where
  rollouts bound asynchronous steps beside a serving worker). Only with the plugin: without it Dask
  would run them at once, on the weights before.
- With the plugin, the runner also submits step k's sync and step k+1's train task as soon as step
  k+1 has started, not at their actions (`RunState.early_sync`): the sync stages the trained version
  on every receiver while step k+1's rollouts run and commits on each receiver once the scheduler
  reports it clear of them: none runs there, and every one not ended runs on another worker
  (`Step.submit_sync_after`), and the train task starts once its rewards are in, after step k's by a
  Dask dependency (`Step.submit_train_after`; not when a checkpoint is due between the two). Neither
  waits for the driver's round trip, nor the next rollouts for the transfer. The `sync` and `train`
  actions then find them submitted. Not for a step that samples dynamically (its rounds are not known
  until they are done).
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("start", "wait", "train", "trained", "sync", "finish")


@dataclass(frozen=True)
class Action:
    kind: str  # start: build, lower and submit the step's rollouts and rewards, on the weights held now;
    #            wait: wait for its rollouts and rewards; train / sync: submit that part; trained: wait
    #            for its train task; finish: gather its train metrics and sync statuses, record the step
    step: int

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown action kind {self.kind!r}; one of {KINDS}")


def plan_run(steps: int, staleness: int, first: int = 0, start_on_sync: bool = False) -> list[Action]:
    """Every action of a run of `steps` steps, in order; from step `first` on (a resumed run: steps
    before it are done), with the same shape as a run of `steps - first` steps. `start_on_sync`:
    asynchronous steps start once the sync of the step two before is submitted (see above)."""
    if not 0 <= first < steps:
        raise ValueError(f"first={first} must be in [0, steps={steps})")
    if first:
        return [Action(a.kind, a.step + first) for a in plan_run(steps - first, staleness, 0, start_on_sync)]
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    if staleness not in (0, 1):
        raise ValueError(f"staleness={staleness} must be 0 (synchronous) or 1 (asynchronous)")
    if staleness == 0:
        # Train and sync are submitted with the rollouts (they wait on them in Dask): no driver round trip.
        return [Action(kind, k) for k in range(steps)
                for kind in ("start", "train", "sync", "wait", "trained", "finish")]
    out = [Action("start", 0), Action("wait", 0), Action("train", 0)]
    for k in range(steps):
        if k + 1 < steps:
            if k == 0 or not start_on_sync:  # else started on step k - 1's sync
                out.append(Action("start", k + 1))
            out.append(Action("wait", k + 1))
        out += [Action("trained", k), Action("sync", k)]
        if k + 1 < steps:
            out.append(Action("train", k + 1))
        if start_on_sync and k + 2 < steps:
            out.append(Action("start", k + 2))
        out.append(Action("finish", k))
    return out
