"""Runs CPU-bound work (ONNX, FAISS) off the event loop, one job at a time.

One job at a time because onnxruntime already spreads one batch over every
core; two concurrent jobs would only contend. Past `max_pending` waiting jobs
the pool refuses work, so overload shows as fast 429s, not growing latency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")


class Overloaded(Exception):
    pass


class ComputePool:
    def __init__(self, max_pending: int, workers: int = 1) -> None:
        self.max_pending = max_pending
        self.pending = 0
        self._limiter = anyio.CapacityLimiter(workers)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        if self.pending >= self.max_pending:
            raise Overloaded(f"{self.pending} requests already waiting for the encoder")
        self.pending += 1
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        finally:
            self.pending -= 1
