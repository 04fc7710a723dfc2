"""Which workers Dask counts as running (not paused, not closing), as the placement book asks: by address."""


class RunningWorkers:
    """Whether Dask counts a worker as running, looked up per address: a report of one worker costs
    O(1), not a set of every worker of a large cluster."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def __contains__(self, addr) -> bool:
        ws = self.scheduler.workers.get(addr)
        return ws is not None and ws in self.scheduler.running
