"""What the SLO controller sees of a co-serving executor's two engines each iteration (its snapshot)."""
from __future__ import annotations

from rose.runtime.coserve.rollout_request import kv_of
from rose.runtime.coserve.slo import RolloutSeq, RolloutView, ServingView


def serving_view(engine, requests, now: float) -> ServingView:
    """`requests`: the serving requests in the engine (a sized collection); `now`: perf_counter seconds."""
    waiting = [q for q in requests if q.t_first is None]
    kv = kv_of(engine)
    return ServingView(
        decoding=len(requests) - len(waiting),
        waiting_prompt_tokens=tuple(q.prompt_tokens for q in waiting),
        oldest_wait_ms=max(((now - q.t_arrival) * 1e3 for q in waiting), default=0.0),
        **({"kv_free_tokens": kv.free_tokens, "kv_needed_tokens": kv.needed_tokens, "kv_usage": kv.usage}
           if kv is not None else {"kv_usage": engine.kv_usage()}))


def rollout_view(engine, running: dict, waiting: list, asleep: bool, waited: int) -> RolloutView:
    """`running`: rollout requests in the engine, by engine request id; `waiting`: those not in it, in order."""
    seqs = tuple(RolloutSeq(eid, len(r.context), r.admitted_at) for eid, r in running.items())
    kv = kv_of(engine) if engine is not None else None
    return RolloutView(
        seqs, tuple(RolloutSeq(r.request_id, len(r.context)) for r in waiting),
        # The rollout engine's own cache bounds what may run in it: what is free plus what the running
        # sequences hold.
        **({"kv_available_tokens": kv.free_tokens + sum(q.kv_tokens for q in seqs)} if kv else {}),
        can_sleep=bool(getattr(engine, "can_sleep", False)), asleep=asleep, waited=waited)
