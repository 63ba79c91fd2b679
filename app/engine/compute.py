"""Runs the CPU-bound retrieval steps (FAISS searches, the poly rerank) off the event loop.

The encoder has its own queue (`batcher.py`). Past `max_pending` waiting jobs
the pool refuses work, so overload shows as fast 429s, not growing latency.

FAISS's OpenMP thread count is per thread: `faiss.omp_set_num_threads` at
startup holds for the thread that called it, and a worker thread starts
with every core. Each worker sets it before its first search; without that,
a one-query scan of an inverted file or of a filtered flat index opened a
team of threads whose spinning took CPU from the encoder.

The hop to the worker is the loop's own `run_in_executor`: anyio's
`to_thread.run_sync` costs about 50 µs more a call (its capacity limiter,
cancel scope and backend lookups; 129 against 77 µs for a no-op here), paid
by every `/reply`. A caller cancelled mid-search (at shutdown) stops
counting as pending while its search finishes. The workers run below the
event loop's priority (`priority.py`), as the encoder's do.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import faiss

from app.engine.batcher import Overloaded
from app.engine.priority import SERVING, lowered

T = TypeVar("T")


class ComputePool:
    def __init__(self, max_pending: int, workers: int = 1, faiss_threads: int = 1) -> None:
        self.max_pending = max_pending
        self.pending = 0
        self.refused = 0
        self.faiss_threads = faiss_threads
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="search", initializer=lowered(SERVING))
        self._worker = threading.local()  # whether this worker thread has set its FAISS threads

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        if self.pending >= self.max_pending:
            self.refused += 1
            raise Overloaded(f"{self.pending} requests already waiting for a search")
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._in_worker, fn, *args)
        finally:
            self.pending -= 1

    def close(self) -> None:
        """Lets the worker threads go once idle; a search already running finishes."""
        self._executor.shutdown(wait=False)

    def _in_worker(self, fn: Callable[..., T], *args: object) -> T:
        if getattr(self._worker, "faiss_threads", None) != self.faiss_threads:
            faiss.omp_set_num_threads(self.faiss_threads)
            self._worker.faiss_threads = self.faiss_threads
        return fn(*args)
