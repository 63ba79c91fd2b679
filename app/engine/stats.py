"""Plain counters the engine keeps for /metrics. The engine knows nothing of
Prometheus; `app/metrics.py` reads these at scrape time."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field


@dataclass
class Buckets:
    """A histogram: counts of observations at or below each bound (the last is everything)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # one per bound, plus the overflow
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """[(upper bound, observations at or below it)], Prometheus' layout, '+Inf' last."""
        running, out = 0, []
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


# Seconds: a stage of one request runs from a few microseconds (a cache read
# from the process) to tens of milliseconds (an encoder pass at load).
STAGE_BOUNDS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
# Every stage /metrics shows, each from the start at 0 (a series born late hides its first rate()).
STAGES = (
    "session_read",  # the session's turns, from Redis or the process
    "cache_read",  # the embedding cache's lookup of the request's texts
    "tokenize",  # text -> token ids, for the texts the cache missed
    "queue_wait",  # from joining the encoder queue to its batch starting, per request
    "encode",  # onnxruntime, per batch: one batch holds one or many requests
    "cache_write",  # keeping the fresh vectors (the process; Redis is written off the request's path)
    "search_queries",  # FAISS over the stored queries
    "search_replies",  # FAISS over the stored replies
    "rerank",  # the poly head over the reply hits
    "read_turn",  # the reaction model's own encoder over the last turn: the mood guard and the reactions read it
    "reactions",  # the reaction set or classifier
    "session_write",  # storing the user's turn and the reply
)


class Stages:
    """One histogram of seconds per stage; observed from the event loop and from worker threads."""

    def __init__(self) -> None:
        self.buckets = {stage: Buckets(STAGE_BOUNDS) for stage in STAGES}
        self._lock = threading.Lock()

    def observe(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.buckets[stage].observe(seconds)

    def observe_all(self, seconds: dict[str, float]) -> None:
        with self._lock:
            for stage, value in seconds.items():
                self.buckets[stage].observe(value)
