"""`Outbox`: hands items from one thread to an asyncio event loop, one wake-up per batch.

The co-serving executor emits a token delta for every decoding request at every serving step (tens
per step at a few hundred steps a second). Handing each to the HTTP front end's loop with its own
`call_soon_threadsafe` writes the loop's wake-up pipe and takes the interpreter lock once per delta,
on the core the two engines step on. Items put while a flush is pending join that flush instead: a
step's deltas reach the loop together, in the order they were put.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Callable


class Outbox:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._items: list[tuple[Callable, tuple]] = []
        self._lock = threading.Lock()
        self.flushes = 0  # wake-ups sent to the loop (for tests and metrics)

    def put(self, fn: Callable, *args) -> None:
        """Call `fn(*args)` on the loop soon (any thread)."""
        with self._lock:
            self._items.append((fn, args))
            if len(self._items) > 1:
                return  # a flush is already on its way
        self.flushes += 1
        try:
            self.loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: nobody is left to read the items
            with self._lock:
                self._items.clear()

    def _flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for fn, args in items:
            fn(*args)
