"""Act on a lowered graph: submit its task specs to a Dask client.

Tasks that differ only in their arguments (one op node's fan-out: every rollout of a step, every
reward) go in one `client.map` call, one message to the scheduler, instead of one `submit` each:
with a hundred rollouts a step, per-task submission costs more than the rollouts' own overhead.
Role placement here is by worker restriction to the addresses that announced the role.
"""
from __future__ import annotations

import itertools

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


def _batch_key(t: TaskSpec, workers) -> tuple:
    return (t.fn, tuple(workers) if workers else None, t.retries, len(t.args), tuple(sorted(t.kwargs)),
            tuple(sorted((k, repr(v)) for k, v in t.annotations.items())))


def submit(client, tasks: list[TaskSpec], workers_by_role: dict[str, list[str]], submitted: dict | None = None) -> dict:
    """Submit in order (tasks are topologically sorted); return {key: Future}. `submitted`: futures of
    tasks of the same graph submitted earlier, which these may depend on."""
    futures = dict(submitted or {})

    def workers_of(t: TaskSpec):
        if t.workers:
            return list(t.workers)
        if t.role is None:
            return None
        workers = workers_by_role.get(t.role)
        if not workers:
            raise GraphError(f"no worker with role {t.role!r} is connected "
                             f"(roles present: {sorted(k for k, v in workers_by_role.items() if v)})", task=t.key)
        return workers

    for _, group in itertools.groupby(tasks, key=lambda t: _batch_key(t, workers_of(t))):
        group = list(group)
        head = group[0]
        workers = workers_of(head)
        with dask.annotate(**head.annotations):
            if len(group) == 1:
                futures[head.key] = client.submit(
                    head.fn, *_resolve(head.args, futures), key=head.key, workers=workers,
                    allow_other_workers=False, retries=head.retries, pure=False,
                    **{k: _resolve(v, futures) for k, v in head.kwargs.items()})
                continue
            columns = [list(col) for col in zip(*(_resolve(t.args, futures) for t in group))]
            kwarg_columns = {k: [_resolve(t.kwargs[k], futures) for t in group] for k in head.kwargs}
            mapped = client.map(head.fn, *columns, key=[t.key for t in group], workers=workers,
                                allow_other_workers=False, retries=head.retries, pure=False, **kwarg_columns)
            futures.update(zip((t.key for t in group), mapped))
    return futures
