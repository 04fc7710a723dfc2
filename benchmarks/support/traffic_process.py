"""The serving traffic's client in a process of its own, at a higher priority where the OS allows it.

The client stands for users on other machines. On this host every core is busy with the run being
measured: a client thread inside the benchmark's process reads its chunks late whenever that process's
other threads hold the interpreter or its core is taken, and a late read counts against the server
(client-side TTFT and TPOT). Its own process, raised above the workers (nice -10, as root), runs when it
has something to read; it needs a few percent of a core (11-20 % in `ps`, at 19.9 req/s of the Azure
trace's streams, elastic_e2e, 2026-12-03). `cores`: where it may run. A benchmark keeps it off the cores of the
job it measures: left to float, it took them at its raised priority whenever it landed there, a cost no
real client puts on a training job (rose's train steps took 1.40-1.43 s beside it where ideal's, with
no serving traffic, took 1.14-1.15 s).
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time


def _play(url: str, trace: str, rate: float, ttft_ms: float, tpot_ms: float, seed: int, stop, out,
          cores: tuple[int, ...] | None = None) -> None:
    if cores:
        os.sched_setaffinity(0, set(cores))
    try:
        os.nice(-10)
    except OSError:  # not permitted: run at the default priority, as a thread would
        pass
    from rose.runtime.coserve import traffic

    arrivals, scale = traffic.azure_trace_at_rate(trace, rate, 3600.0)
    out.put(("ready", scale))
    out.put(("report", asyncio.run(traffic.play(url, arrivals, ttft_ms, tpot_ms, seed=seed, stop=stop))))


class TrafficProcess:
    """Replays the Azure trace at `rate` req/s against `url` from its start until `stop`."""

    def __init__(self, url: str, trace: str, rate: float, ttft_ms: float, tpot_ms: float, seed: int,
                 cores: tuple[int, ...] | None = None):
        ctx = mp.get_context("spawn")
        self._stop, self._out = ctx.Event(), ctx.Queue()
        args = (url, trace, rate, ttft_ms, tpot_ms, seed, self._stop, self._out, cores)
        self.proc = ctx.Process(target=_play, args=args,
                                daemon=True, name="serving-traffic")
        self.proc.start()
        self.scale = self._get("ready", 120)  # the trace's time scale
        self.started = time.monotonic()  # about when the replay began: arrival times count from here (s)

    def _get(self, kind: str, timeout: float):
        got, value = self._out.get(timeout=timeout)
        if got != kind:
            raise RuntimeError(f"the traffic process sent {got!r} where {kind!r} was due")
        return value

    def cpu_s(self) -> float:
        """The client process's CPU seconds so far (user + system)."""
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def stop(self, timeout: float = 120):
        """Send no more requests; the `LoadReport` of those sent, once they finish."""
        self._stop.set()
        report = self._get("report", timeout)
        self.proc.join(10)
        return report
