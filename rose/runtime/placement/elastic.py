"""The resource-elastic baseline's scaling decision: how many extra dedicated workers to hold.

Pure: the plugin answers the cluster's adaptive loop with `elastic_target(...)`; the cluster asks its
resource manager for that many workers, each of which arrives after the allocation delay and then
pays its own engine start-up (`rose.runtime.cluster.ElasticRoseCluster`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rose.errors import config_check


@dataclass(frozen=True)
class ElasticConfig:
    max_extra: int = 1  # on-demand workers at most, on top of the ones the cluster started with
    worker_slots: int = 128  # rollout sequences one on-demand worker runs at once
    idle_release_s: float = 60.0  # give an on-demand worker back after this long with no rollout work (s)
    allocation_delay_s: float = 20.0  # from asking for a worker to its process starting (s)

    def __post_init__(self):
        c = "ElasticConfig"
        config_check(self.max_extra >= 0, c, "max_extra", self.max_extra, ">= 0")
        config_check(self.worker_slots >= 1, c, "worker_slots", self.worker_slots, ">= 1")
        config_check(self.idle_release_s >= 0, c, "idle_release_s", self.idle_release_s, ">= 0")
        config_check(self.allocation_delay_s >= 0, c, "allocation_delay_s", self.allocation_delay_s, ">= 0")


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
