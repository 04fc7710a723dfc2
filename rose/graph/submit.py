"""Act on a lowered graph: submit its task specs to a Dask client.

Role placement here is by worker restriction to the addresses that announced the role. (The
elastic scheduler plugin replaces this for rollout tasks.)
"""
from __future__ import annotations

import dask

from rose.errors import GraphError
from rose.graph.lower import Ref, TaskSpec


def _resolve(value, futures):
    if isinstance(value, Ref):
        return futures[value.key]
    if isinstance(value, list):
        return [_resolve(v, futures) for v in value]
    if isinstance(value, tuple):
        return tuple(_resolve(v, futures) for v in value)
    return value


def submit(client, tasks: list[TaskSpec], workers_by_role: dict[str, list[str]]) -> dict:
    """Submit in order (tasks are topologically sorted); return {key: Future}."""
    futures = {}
    for t in tasks:
        workers = list(t.workers) if t.workers else None
        if workers is None and t.role is not None:
            workers = workers_by_role.get(t.role)
            if not workers:
                raise GraphError(f"no worker with role {t.role!r} is connected "
                                 f"(roles present: {sorted(k for k, v in workers_by_role.items() if v)})",
                                 task=t.key)
        args = _resolve(t.args, futures)
        kwargs = {k: _resolve(v, futures) for k, v in t.kwargs.items()}
        with dask.annotate(**t.annotations):
            futures[t.key] = client.submit(t.fn, *args, key=t.key, workers=workers, allow_other_workers=False,
                                           retries=t.retries, pure=False, **kwargs)
    return futures
