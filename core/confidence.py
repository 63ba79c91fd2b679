"""How sure reply matching is of its top reply: a logistic regression over
features of its hits, fitted on validation turns by `models/confidence_fit.py`.

Pure numpy; the features are computed here and nowhere else, so the fit and
the service see the same numbers.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from core.bundle import ConfidenceSpec

DEPTH = 10  # reply-matching hits the features look at


def features(scores: Sequence[float], turns: Sequence[str], top_reply: str = "") -> dict[str, float]:
    """scores: reply matching's distinct hits, best first (after rerank); turns: the context it saw;
    top_reply: the text of the best hit."""
    top = np.asarray(scores[:DEPTH], dtype=np.float64)  # [<= DEPTH]
    if not len(top):
        top = np.zeros(1)
    second = top[1] if len(top) > 1 else top[0]
    return {
        "top1": float(top[0]),
        # A clear winner over its neighbours: in a dense region of replies
        # ("lol", "yeah") many candidates score alike and the top one is a guess.
        "margin": float(top[0] - second),
        "spread": float(top[0] - top.mean()),
        # Short, generic last turns ("ok", "haha") leave the next turn open.
        "log_last_chars": math.log1p(len(turns[-1])) if turns else 0.0,
        "log_context_chars": math.log1p(sum(len(t) for t in turns)),
        # A question narrows what comes next; a statement often changes the topic.
        "last_is_question": 1.0 if turns and "?" in turns[-1] else 0.0,
        # A long, specific reply is on topic or clearly not; a short one fits many turns.
        "log_top_reply_chars": math.log1p(len(top_reply)),
    }


@dataclass(frozen=True)
class ConfidenceModel:
    spec: ConfidenceSpec

    def __call__(self, values: dict[str, float]) -> float:
        """The probability that reply matching's top reply is acceptable."""
        z = self.spec.bias + sum(
            w * (values[name] - mean) / scale
            for name, mean, scale, w in zip(
                self.spec.features, self.spec.mean, self.spec.scale, self.spec.weight, strict=True
            )
        )
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def threshold_for_share(self, share: float) -> float:
        """The confidence below which `share` of the validation turns fell."""
        return threshold_for_share(self.spec.quantiles, share)


def threshold_for_share(quantiles: Sequence[float], share: float) -> float:
    """quantiles: [101] confidences, 0th to 100th percentile -> the one below which `share` fell."""
    return float(quantiles[min(len(quantiles) - 1, max(0, round(share * (len(quantiles) - 1))))])


# Few, because the fallback is the larger error: at 20 turns the quantile sits between the 2nd
# and 3rd lowest, which is noisy, where a fallback 2 to 40 points off the set's share held for
# 200 turns cost its first users (`python -m bench.reaction_share`).
WARMUP_TURNS = 20


@dataclass
class ShareThreshold:
    """The confidence below which `share` of recent turns fell: the reaction share as the
    product call states it, a share of turns, whatever the candidate set.

    A threshold fitted on validation turns holds that share only for the candidate
    set it was fitted against: on another set the scores shift (measured with the
    release: 26% of turns instead of 10% against the validation split's own 13,895
    replies). So the last `window` confidences of this index version set it; until
    `warmup` of them are in, `fallback` does: the threshold the version's stored
    replies give (`index/confidence_quantiles.py`), or the validation one."""

    share: float
    fallback: float  # the threshold until `warmup` turns are in
    window: int = 2000
    warmup: int = WARMUP_TURNS
    _seen: np.ndarray = field(init=False)  # [window] a ring of the last confidences
    _count: int = 0  # confidences observed, up to window
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._seen = np.zeros(self.window, dtype=np.float64)

    def observe(self, confidence: float) -> None:
        with self._lock:
            self._seen[self._next] = confidence
            self._next = (self._next + 1) % self.window
            self._count = min(self._count + 1, self.window)

    def threshold(self) -> float:
        """np.quantile's default (linear) of the window, by partition: it runs on every turn,
        and a full sort of 2,000 values is most of its cost."""
        with self._lock:
            n = self._count
            if n < max(self.warmup, 1):
                return self.fallback
            position = (n - 1) * self.share
            low = int(position)
            high = min(low + 1, n - 1)
            values = np.partition(self._seen[:n], [low, high])
            return float(values[low] + (position - low) * (values[high] - values[low]))
