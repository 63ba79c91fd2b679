"""Runs the CPU-bound retrieval steps (FAISS searches, the poly rerank) off the event loop.

The encoder has its own queue (`batcher.py`). Past `max_pending` waiting jobs
the pool refuses work, so overload shows as fast 429s, not growing latency.

FAISS's OpenMP thread count is per thread: `faiss.omp_set_num_threads` at
startup holds for the thread that called it, and a worker thread starts
with every core. Each worker sets it before its first search; without that,
a one-query scan of an inverted file or of a filtered flat index opened a
team of threads whose spinning took CPU from the encoder.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread
import faiss

from app.engine.batcher import Overloaded

T = TypeVar("T")


class ComputePool:
    def __init__(self, max_pending: int, workers: int = 1, faiss_threads: int = 1) -> None:
        self.max_pending = max_pending
        self.pending = 0
        self.refused = 0
        self.faiss_threads = faiss_threads
        self._limiter = anyio.CapacityLimiter(workers)
        self._worker = threading.local()  # whether this worker thread has set its FAISS threads

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        if self.pending >= self.max_pending:
            self.refused += 1
            raise Overloaded(f"{self.pending} requests already waiting for a search")
        self.pending += 1
        try:
            return await anyio.to_thread.run_sync(self._in_worker, fn, *args, limiter=self._limiter)
        finally:
            self.pending -= 1

    def _in_worker(self, fn: Callable[..., T], *args: object) -> T:
        if getattr(self._worker, "faiss_threads", None) != self.faiss_threads:
            faiss.omp_set_num_threads(self.faiss_threads)
            self._worker.faiss_threads = self.faiss_threads
        return fn(*args)
