"""`ServingRequest`: one online request in the co-serving executor, as its caller sees it."""
from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class ServingRequest:
    """One online request. `deltas` yields (new token ids, finished, finish reason) as they come."""

    request_id: str
    prompt_tokens: int
    t_arrival: float = field(default_factory=time.perf_counter)
    t_first: float | None = None  # first token, perf_counter seconds
    t_done: float | None = None
    tokens: int = 0
    deltas: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    # Called on the executor's thread with each (token ids, finished, reason) instead of queueing
    # it in `deltas` (the HTTP front end hands them to its event loop).
    on_delta: Callable | None = None

    def collect(self, timeout: float | None = None) -> tuple[list[int], str | None]:
        """Block until the request finishes (when it has no `on_delta`): (all tokens, finish reason)."""
        tokens: list[int] = []
        while True:
            new, done, reason = self.deltas.get(timeout=timeout)
            tokens += new
            if done:
                return tokens, reason

    def emit(self, token_ids: list[int], finished: bool, reason: str | None) -> None:
        if self.on_delta is not None:
            self.on_delta(token_ids, finished, reason)
        else:
            self.deltas.put((token_ids, finished, reason))


def deliver(requests: dict[str, ServingRequest], outputs, now: float) -> int:
    """Route one serving engine step's outputs, seen at `now` (perf_counter seconds), to their requests
    (by engine request id); finished requests leave `requests`. Returns the tokens delivered."""
    tokens = 0
    for o in outputs:
        req = requests.get(o.request_id)
        if req is None:
            continue
        if o.token_ids and req.t_first is None:
            req.t_first = now
        req.tokens += len(o.token_ids)
        tokens += len(o.token_ids)
        if o.finished:
            req.t_done = now
            del requests[o.request_id]
        req.emit(list(o.token_ids), o.finished, o.error or o.finish_reason)
    return tokens


def fail_all(requests: dict[str, ServingRequest], reason: str) -> None:
    """End every request in `requests` with an error naming `reason`; `requests` is left empty."""
    for req in requests.values():
        req.emit([], True, f"error: {reason}")
    requests.clear()
