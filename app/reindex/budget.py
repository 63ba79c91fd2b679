"""How many index builds one process runs at once: a memory budget shared by every set's jobs.

Each set's reindex job runs in a thread of the process that serves every set, and a build holds its
texts, both sides' vectors and the FAISS graphs in memory: ~0.4 GB above steady state for 96k
candidates (peak RSS against steady in the chaos scenario of two reindexes at once). Uploads to
several sets at once could take the process past its memory and down with every set. A job waits
here (its state says so) until its estimate fits beside the builds running; one larger than the
whole budget runs alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

BYTES_PER_CANDIDATE = 4_400  # ~0.4 GB over 96k candidates (chaos: two reindexes at once), rounded up


class BuildBudget:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0  # estimated bytes of the builds running
        self.running = 0
        self._changed = threading.Condition()

    @staticmethod
    def estimate(candidates: int) -> int:
        return candidates * BYTES_PER_CANDIDATE

    @contextmanager
    def held(self, candidates: int, waiting: Callable[[], None] | None = None) -> Iterator[None]:
        """Blocks until a build of `candidates` fits, then holds its share until the block ends.
        `waiting()` is called once if it has to wait (the job says so)."""
        cost = self.estimate(candidates)
        with self._changed:
            if self.running and self.used + cost > self.max_bytes and waiting is not None:
                waiting()
            while self.running and self.used + cost > self.max_bytes:
                self._changed.wait()
            self.used += cost
            self.running += 1
        try:
            yield
        finally:
            with self._changed:
                self.used -= cost
                self.running -= 1
                self._changed.notify_all()
