"""Threshold fitting on synthetic walk features with a known best answer."""

from __future__ import annotations

import numpy as np

from models.calibrate import ALWAYS, fit
from models.walk import WalkFeatures, sources, utility


def features(has_reactions: bool = True, n: int = 400) -> WalkFeatures:
    rng = np.random.default_rng(0)
    query_score = rng.uniform(0, 1, n)  # [N]
    reply_score = rng.uniform(-1, 1, n)  # [N]
    judged = {
        # Query similarity is good only when very sure; reply matching when fairly sure;
        # a reaction is mediocre everywhere.
        "query_similarity": np.where(query_score >= 0.8, 0.9, 0.1),
        "reply_matching": np.where(reply_score >= 0.2, 0.7, 0.2),
        "reaction": np.full(n, 0.4) if has_reactions else np.full(n, -np.inf),
    }
    answers = {s: [""] * n for s in judged}
    return WalkFeatures(query_score, reply_score, answers, judged, has_reactions)


def test_fit_sends_each_turn_to_the_source_that_serves_it_best() -> None:
    f = features()
    thresholds, figures = fit(f)
    best = np.where(
        f.query_score >= 0.8, "query_similarity", np.where(f.reply_score >= 0.2, "reply_matching", "reaction")
    )
    # The grid is score quantiles (1% apart), so only turns next to the true cut may differ.
    assert (sources(f, thresholds) == best).mean() >= 0.97
    assert abs(thresholds.query_similarity - 0.8) < 0.02 and abs(thresholds.reply_matching - 0.2) < 0.04
    assert figures["value"] >= utility(f, best).mean() - 0.01
    assert figures["value"] > max(figures["baselines"].values())
    assert sum(figures["shares"].values()) == 1.0


def test_without_reactions_reply_matching_takes_every_turn_query_similarity_leaves() -> None:
    f = features(has_reactions=False)
    thresholds, figures = fit(f)
    assert thresholds.reply_matching == ALWAYS
    assert figures["shares"]["reaction"] == 0.0
