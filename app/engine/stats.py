"""Plain counters the engine keeps for /metrics. The engine knows nothing of
Prometheus; `app/metrics.py` reads these at scrape time."""

from __future__ import annotations

import bisect
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
