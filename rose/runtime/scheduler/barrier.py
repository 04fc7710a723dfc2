"""Waiting on the scheduler for tasks to end, without a client: the `rose_keys_done` handler.

An asynchronous step's weight sync stages the trained version on every receiver while the next step's
rollouts still run, and commits it once they are done (weights never change under a running
trajectory; `rose.run_state`). The commit waits here, on the scheduler, which hears of each task's
end first. Waiting at the driver put its round trip and the sync's own calls (the receivers' state,
the shards) before each commit, where rollouts bound the step: the next rollouts were dispatched 26-40
ms after the train step began (each run's median, eight runs on the Zen 5 host, 2026-12-05), 16-27 ms
in seven of eight with the commit waiting here (RESULTS, elastic_e2e). The transfer this takes off
that path grows with the model and the link.

A receiver need not wait for every one of those rollouts, only for those it runs (`KeyBarrier.wait`
with a worker): once each rollout group not yet ended runs on another worker, nothing of that step
will run on this one again, and it may swap to the next version and take the next step's rollouts,
which wait for it. On a 2-core host the serving worker sat idle for 0.17-0.23 s a step until the
dedicated worker's last conversations ended (RESULTS, elastic_e2e).
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from rose.runtime.protocol import group_of

# A task in one of these states will not run (again) for the keys a caller waits on: it holds its
# result, it failed, or nobody wants it any more. A task whose result is lost later (its worker died)
# runs again, but whoever waited has moved on by then, as a driver that had gathered it would have.
DONE = frozenset({"memory", "erred", "forgotten"})


class _Wait:
    __slots__ = ("worker", "keys", "event")

    def __init__(self, worker: str | None, keys: list[str]):
        self.worker = worker  # the receiver that waits (None: a caller that waits for every key to end)
        self.keys = keys  # first tasks of the rollout groups it waits for
        self.event = asyncio.Event()


def clear_of(worker: str | None, pending: Iterable[str], inflight: Mapping[str, Iterable[str]]) -> bool:
    """Whether no rollout group of `pending` (keys of the groups' first tasks, not ended) can run on
    `worker` any more: each has a task running now (in `inflight`: worker address -> keys of the managed
    tasks running there), and none on `worker`. A group with nothing running (parked, or between a
    shed task's yield and its continuation's arrival) may still go anywhere, so it holds every worker;
    so does a key that is no rollout group at all. `worker` None (a caller that runs none of them and
    waits for them all): clear once none is pending."""
    pending = set(pending)
    if not pending:
        return True
    if worker is None:
        return False
    running = set()
    for addr, keys in inflight.items():
        for key in keys:
            g = group_of(key)
            if g in pending:
                if addr == worker:
                    return False
                running.add(g)
    return running == pending


class KeyBarrier:
    """Callers waiting for a worker to be clear of sets of task keys (or for the keys to end), woken by
    `recheck`, which the scheduler plugin calls while any waits: after each task it manages starts, ends
    or yields, and after any other task ends."""

    def __init__(self):
        self._waits: list[_Wait] = []
        self.calls = 0  # waits asked for
        self.waited = 0  # of which had to wait

    @staticmethod
    def pending(tasks: Mapping, keys: Iterable[str]) -> set[str]:
        """The keys of `keys` whose task (in `tasks`, the scheduler's key -> TaskState) has not ended. A
        key the scheduler does not hold is done: it was forgotten, which a rollout the driver still holds
        never is."""
        return {k for k in keys if (ts := tasks.get(k)) is not None and ts.state not in DONE}

    async def wait(self, tasks: Mapping, keys: Iterable[str], worker: str | None = None,
                   inflight: Mapping[str, Iterable[str]] | None = None) -> int:
        """Return once `worker` is clear of the rollout groups of `keys` (`clear_of`; `inflight`: the
        managed tasks running, by worker), at the latest once every task of `keys` has ended; with no
        worker, once they all have. How many of `keys` had not ended when called."""
        self.calls += 1
        keys, inflight = list(keys), inflight or {}
        left = self.pending(tasks, keys)
        if clear_of(worker, left, inflight):
            return 0
        self.waited += 1
        w = _Wait(worker, keys)
        self._waits.append(w)
        try:
            await w.event.wait()
        finally:  # woken, or cancelled (the caller's connection closed): nothing stays registered for it
            if w in self._waits:
                self._waits.remove(w)
        return len(left)

    @property
    def waits(self) -> int:
        """Callers still waiting."""
        return len(self._waits)

    def recheck(self, tasks: Mapping, inflight: Mapping[str, Iterable[str]]) -> None:
        """Wake the callers that are clear now."""
        for w in list(self._waits):
            if clear_of(w.worker, self.pending(tasks, w.keys), inflight):
                self._waits.remove(w)
                w.event.set()
