"""Waiting on the scheduler for tasks to end, without a client: the `rose_keys_done` handler.

An asynchronous step's weight sync stages the trained version on every receiver while the next step's
rollouts still run, and commits it once they are done (weights never change under a running
trajectory; `rose.run_state`). The commit waits here, on the scheduler, which hears of each task's
end first. Waiting at the driver put its round trip and the sync's own calls (the receivers' state,
the shards) before each commit, where rollouts bound the step: the next rollouts were dispatched 26-40
ms after the train step began (each run's median, eight runs on the Zen 5 host, 2026-12-05), 16-27 ms
in seven of eight with the commit waiting here (RESULTS, elastic_e2e). The transfer this takes off
that path grows with the model and the link.

A receiver need not wait for every one of those rollouts, only for those it runs (`wait_clear`): once
each rollout group not yet ended runs on another worker, nothing of that step will run on this one
again, and it may swap to the next version and take the next step's rollouts, which wait for it. On a
2-core host the serving worker sat idle for 0.17-0.23 s a step until the dedicated worker's last
conversations ended (RESULTS, elastic_e2e).
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
    __slots__ = ("left", "event")

    def __init__(self, left: set[str]):
        self.left = left  # keys not done yet
        self.event = asyncio.Event()


class _ClearWait:
    __slots__ = ("worker", "keys", "event")

    def __init__(self, worker: str, keys: list[str]):
        self.worker = worker  # the receiver that waits
        self.keys = keys  # first tasks of the rollout groups it waits for
        self.event = asyncio.Event()


def clear_of(worker: str, pending: Iterable[str], inflight: Mapping[str, Iterable[str]]) -> bool:
    """Whether no rollout group of `pending` (keys of the groups' first tasks, not ended) can run on
    `worker` any more: each has a task running now (in `inflight`: worker address -> keys of the managed
    tasks running there), and none on `worker`. A group with nothing running (parked, or between a
    shed task's yield and its continuation's arrival) may still go anywhere, so it holds every worker;
    so does a key that is no rollout group at all."""
    pending = set(pending)
    if not pending:
        return True
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
    """Callers waiting for sets of task keys to end, or for a worker to be clear of them; fed by the
    scheduler plugin's `transition` hook (and `recheck` for the latter)."""

    def __init__(self):
        self._by_key: dict[str, list[_Wait]] = {}
        self._clear: list[_ClearWait] = []  # callers of `wait_clear`
        self.calls = 0  # waits asked for
        self.waited = 0  # of which had a key not done yet

    def __contains__(self, key: str) -> bool:  # the hook's hot path: one dict lookup per transition
        return key in self._by_key

    def __len__(self) -> int:  # keys someone waits on
        return len(self._by_key)

    @staticmethod
    def pending(tasks: Mapping, keys: Iterable[str]) -> set[str]:
        """The keys of `keys` whose task (in `tasks`, the scheduler's key -> TaskState) has not ended. A
        key the scheduler does not hold is done: it was forgotten, which a rollout the driver still holds
        never is."""
        return {k for k in keys if (ts := tasks.get(k)) is not None and ts.state not in DONE}

    async def wait(self, tasks: Mapping, keys: Iterable[str]) -> int:
        """Return once every task of `keys` has ended; how many had not when called."""
        self.calls += 1
        left = self.pending(tasks, keys)
        if not left:
            return 0
        self.waited += 1
        n, w = len(left), _Wait(left)
        for k in left:
            self._by_key.setdefault(k, []).append(w)
        try:
            await w.event.wait()
        finally:  # cancelled (the caller's connection closed): nothing stays registered for it
            for k in list(w.left):
                waits = self._by_key.get(k, [])
                if w in waits:
                    waits.remove(w)
                if not waits:
                    self._by_key.pop(k, None)
        return n

    async def wait_clear(self, tasks: Mapping, keys: Iterable[str], worker: str,
                         inflight: Mapping[str, Iterable[str]]) -> int:
        """Return once `worker` is clear of the rollout groups of `keys` (`clear_of`): at the latest
        when every task of `keys` has ended. The caller (the plugin) calls `recheck` whenever a managed
        task starts, ends or yields. How many of `keys` had not ended when called."""
        self.calls += 1
        keys = list(keys)
        left = self.pending(tasks, keys)
        if clear_of(worker, left, inflight):
            return 0
        self.waited += 1
        w = _ClearWait(worker, keys)
        self._clear.append(w)
        try:
            await w.event.wait()
        finally:
            if w in self._clear:
                self._clear.remove(w)
        return len(left)

    @property
    def clear_waits(self) -> int:
        """Callers of `wait_clear` still waiting."""
        return len(self._clear)

    def recheck(self, tasks: Mapping, inflight: Mapping[str, Iterable[str]]) -> None:
        """Wake the callers of `wait_clear` whose worker is clear now."""
        for w in list(self._clear):
            if clear_of(w.worker, self.pending(tasks, w.keys), inflight):
                self._clear.remove(w)
                w.event.set()

    def transition(self, key: str, finish: str) -> None:
        """Task `key` went to state `finish`."""
        if finish not in DONE:
            return
        for w in self._by_key.pop(key, ()):
            w.left.discard(key)
            if not w.left:
                w.event.set()
