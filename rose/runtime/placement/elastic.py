"""The resource-elastic baseline's scaling decision: how many extra dedicated workers to hold.

Pure: the plugin answers the cluster's adaptive loop with `elastic_target(...)`; the cluster asks its
resource manager for that many workers, each of which arrives after the allocation delay and then
pays its own engine start-up (`LocalRoseCluster` with `ClusterConfig(policy="elastic")` does this
through `SpecCluster.scale`).
"""
from __future__ import annotations

import math

from rose.config import ElasticConfig


def elastic_target(waiting_seqs: int, held: int, arriving: int, idle_s: float, cfg: ElasticConfig) -> int:
    """On-demand workers to hold in all (up and arriving).

    `waiting_seqs`: rollout sequences waiting that no worker has room for; `held`: on-demand workers up;
    `arriving`: asked for and not up yet (their slots already count against the wait); `idle_s`: seconds
    since any rollout waited or ran. Grows to cover the wait, up to the cap; gives everything back only
    after the idle grace, never while work waits.
    """
    uncovered = max(0, waiting_seqs - arriving * cfg.worker_slots)
    want = held + arriving + math.ceil(uncovered / cfg.worker_slots)
    if waiting_seqs <= 0 and idle_s >= cfg.idle_release_s:
        want = 0
    return max(0, min(cfg.max_extra, want))
