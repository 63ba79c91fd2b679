"""Seconds per stage of one request, added up as it runs.

The retrieval strategies time their FAISS searches, the poly rerank and the
reactions into a `Laps` they are handed; the service reads it into its
/metrics histograms afterwards (`app.engine.stats.Stages`). Offline callers
pass none and pay nothing. A stage timed inside another (the reader's pass
inside the reactions) is its own: the outer stage keeps only the rest, so
the stages add up to the request's time once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Laps:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._open: list[str] = []  # the stages being timed, innermost last (one request: one thread)

    @contextmanager
    def time(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        self._open.append(stage)
        try:
            yield
        finally:
            self._open.pop()
            elapsed = time.perf_counter() - started
            self.add(stage, elapsed)
            if self._open:
                self.add(self._open[-1], -elapsed)

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds


@contextmanager
def lap(laps: Laps | None, stage: str) -> Iterator[None]:
    """`laps.time(stage)`, or nothing when there is no `laps` to add to."""
    if laps is None:
        yield
        return
    with laps.time(stage):
        yield
