"""Runs the CPU-bound retrieval steps (FAISS searches, the poly rerank) off the event loop.

The encoder has its own queue (`batcher.py`). Past `max_pending` waiting jobs
the pool refuses work, so overload shows as fast 429s, not growing latency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

from app.engine.batcher import Overloaded

T = TypeVar("T")


class ComputePool:
    def __init__(self, max_pending: int, workers: int = 1) -> None:
        self.max_pending = max_pending
        self.pending = 0
        self.refused = 0
        self._limiter = anyio.CapacityLimiter(workers)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        if self.pending >= self.max_pending:
            self.refused += 1
            raise Overloaded(f"{self.pending} requests already waiting for a search")
        self.pending += 1
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        finally:
            self.pending -= 1
