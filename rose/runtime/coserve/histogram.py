"""Latency histograms of the serving endpoint's `GET /metrics`, in Prometheus' text format."""
from __future__ import annotations

TTFT_BUCKETS_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
TPOT_BUCKETS_MS = (5, 10, 20, 40, 80, 160, 320, 640)


class Histogram:
    """A Prometheus histogram (cumulative buckets, sum, count), rendered as exposition text."""

    def __init__(self, name: str, help_: str, buckets):
        self.name, self.help, self.buckets = name, help_, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        self.n += 1
        self.total += v
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def text(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cum = 0
        for b, c in zip(self.buckets, self.counts):
            cum += c
            lines.append(f'{self.name}_bucket{{le="{b}"}} {cum}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.n}')
        lines += [f"{self.name}_sum {self.total}", f"{self.name}_count {self.n}"]
        return lines
