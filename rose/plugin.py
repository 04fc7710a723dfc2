"""Scheduler preload: `dask scheduler --preload rose.plugin [--rose-policy {rose,fixed,elastic}]
[--rose-shed-after S] [--rose-migrate]`.

Installs the rollout placement plugin (`rose.runtime.scheduler.plugin.RoseScheduler`, which keeps its
state in `rose.runtime.scheduler.book`) and the ROSE page of the Dask dashboard. Placement by policy:
rose puts rollouts on dedicated workers, then on serving workers' spare capacity; fixed on dedicated
workers only; elastic on dedicated workers plus on-demand ones. A worker that stays over its slots for
`--rose-shed-after` seconds is asked to shed its newest rollouts, which finish elsewhere; a dedicated
worker started `--rose-colocated` yields its device while a train step runs (and takes nothing new
while one waits only for its rewards). With `--rose-migrate` (rose only), once nothing waits and a
dedicated worker has room, the oldest rollouts on serving workers move there.

The same settings come from dask config (`rose.policy`, `rose.shed-after`, `rose.migrate`), e.g.
DASK_ROSE__POLICY=fixed.
"""
from __future__ import annotations

import click
import dask

from rose.config import POLICIES
from rose.runtime.scheduler.dashboard import register
from rose.runtime.scheduler.plugin import RoseScheduler, get_plugin

__all__ = ["RoseScheduler", "dask_setup", "get_plugin"]

# The dashboard page must be in Dask's table of pages before the scheduler starts its dashboard; a
# scheduler imports its preloads first, so this runs in time.
register()


@click.command()
@click.option("--rose-policy", type=click.Choice(POLICIES), default=None,
              help="rollout placement: rose (dedicated, then serving spare capacity), fixed (dedicated only), "
                   "elastic (dedicated, plus on-demand workers)  [default: dask config rose.policy, else rose]")
@click.option("--rose-shed-after", type=click.FloatRange(min=0), default=None,
              help="seconds a worker may stay over its slots before it is asked to shed rollouts [default: 0.5]")
@click.option("--rose-migrate", is_flag=True, default=False,
              help="move the oldest rollouts off serving workers once nothing waits and a dedicated worker has "
                   "room [default: dask config rose.migrate, else off]")
def dask_setup(scheduler, rose_policy, rose_shed_after, rose_migrate):
    policy = rose_policy or dask.config.get("rose.policy", "rose")
    if policy not in POLICIES:
        raise click.BadParameter(f"rose.policy={policy!r}; choose one of {list(POLICIES)}", param_hint="rose.policy")
    shed_after = rose_shed_after if rose_shed_after is not None else float(dask.config.get("rose.shed-after", 0.5))
    migrate = rose_migrate or bool(dask.config.get("rose.migrate", False))
    scheduler.add_plugin(RoseScheduler(policy=policy, shed_after_s=shed_after, migrate=migrate))
