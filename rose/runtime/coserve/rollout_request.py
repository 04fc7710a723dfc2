"""A rollout request on a co-serving executor, across its engine requests (it is preempted and resumed)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from rose.runtime.engine.base import SamplingSpec
from rose.runtime.engine.pending import PendingRollout


@dataclass(kw_only=True)
class RolloutRequest(PendingRollout):
    """A rollout request across its engine requests: one, plus one per resume after a preemption."""

    prompt: list[int]
    spec: SamplingSpec
    segment: int = 0  # engine requests made so far (1 + times resumed)
    admitted_at: int = 0  # order of its latest admission (the controller preempts the newest first)
    engine_id: str | None = None  # id of the live engine request, None while waiting

    @property
    def context(self) -> list[int]:
        return self.prompt + self.gen.token_ids

    def next_segment(self) -> tuple[str, SamplingSpec]:
        """(engine request id, sampling) of its next engine request: the tokens it has left to generate,
        a seed of its own per segment."""
        self.segment += 1
        spec = replace(self.spec, max_tokens=self.spec.max_tokens - len(self.gen.token_ids),
                       seed=None if self.spec.seed is None else self.spec.seed + self.segment - 1)
        return f"{self.request_id}~{self.segment}", spec


def kv_of(engine):  # its `KvState`, or None for an engine with no KV cache to report (FakeEngine): no pressure
    return engine.kv_state() if hasattr(engine, "kv_state") else None
