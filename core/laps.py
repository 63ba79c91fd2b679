"""Seconds per stage of one request, added up as it runs.

The retrieval strategies time their FAISS searches, the poly rerank and the
reactions into a `Laps` they are handed; the service reads it into its
/metrics histograms afterwards (`app.engine.stats.Stages`). Offline callers
pass none and pay nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Laps:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def time(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - started)

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
