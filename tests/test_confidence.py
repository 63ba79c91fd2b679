"""The rolling reaction share: the least confident share of recent turns, whatever the candidate set."""

from __future__ import annotations

import numpy as np

from app.engine.confidence import ShareThreshold


def test_until_warm_the_validation_threshold_holds() -> None:
    share = ShareThreshold(share=0.1, fallback=0.77, warmup=50)
    for value in np.linspace(0, 1, 49):
        share.observe(float(value))
    assert share.threshold() == 0.77


def test_the_threshold_keeps_the_share_when_scores_shift() -> None:
    rng = np.random.default_rng(0)
    share = ShareThreshold(share=0.1, fallback=0.77, window=1000, warmup=100)
    shifted = rng.uniform(0.2, 0.6, 3000)  # another candidate set: every confidence below the fitted 0.77
    below = []
    for value in shifted:
        below.append(value < share.threshold())
        share.observe(float(value))
    # The fitted threshold alone would have sent every turn to reactions; once warm, the rolling one about 10%.
    assert all(below[:100])
    assert 0.08 <= np.mean(below[100:]) <= 0.12


def test_the_window_forgets_what_came_before() -> None:
    share = ShareThreshold(share=0.5, fallback=0.0, window=100, warmup=10)
    for _ in range(100):
        share.observe(0.9)
    for _ in range(100):
        share.observe(0.1)
    assert share.threshold() == 0.1
