"""The trajectory ledger: what each step planned against what its train op received.

`lost` and `duplicated` in a run's report come from here, not from the results the driver gathers
(Dask keys those one per task, so counting them could never find a loss). The prompts op plans a
step's trajectory ids before any task runs; the train op returns the ids of every row it received
(`train_step`'s metrics). A planned id the trainer never saw is lost; an id it saw more than once,
or one nobody planned, is duplicated (counted once per extra row).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass


@dataclass(frozen=True)
class StepLedger:
    step: int
    planned: int  # trajectory ids the step asked for
    received: int  # rows the train op received
    lost: int  # planned ids the train op never received
    duplicated: int  # extra rows: an id received again, or received without being planned
    lost_ids: tuple[str, ...] = ()  # the first few, for the error or log that names them
    duplicated_ids: tuple[str, ...] = ()


def reconcile(step: int, planned: set[str], received: list[str], show: int = 5) -> StepLedger:
    """One step's account: the ids planned against the ids (one per row) the train op received."""
    counts = collections.Counter(received)
    lost = sorted(planned - counts.keys())
    extra = {i: c - (1 if i in planned else 0) for i, c in counts.items()}
    dup = sorted(i for i, c in extra.items() if c > 0)
    return StepLedger(step, len(planned), len(received), len(lost), sum(extra[i] for i in dup),
                      tuple(lost[:show]), tuple(dup[:show]))
