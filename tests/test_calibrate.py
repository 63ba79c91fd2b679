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
    chance = np.full(n, 0.0)  # no answer above is off topic
    return WalkFeatures(query_score, reply_score, answers, judged, has_reactions, chance)


def test_fit_sends_each_turn_to_the_source_that_serves_it_best() -> None:
    f = features()
    thresholds, figures = fit(f, off_topic_cost=0.0)
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


def test_an_off_topic_cost_sends_the_unsure_turns_to_reactions() -> None:
    f = features()
    f.judged["query_similarity"][:] = -1.0  # out of the way: the choice is reply matching or a reaction
    f.judged["reply_matching"] = np.where(f.reply_score >= 0.0, 0.3, 0.05)  # [N]: off topic when unsure
    f.judged["reaction"][:] = 0.04  # a little worse than an off-topic reply, by the cosine alone
    f.chance[:] = 0.1
    thresholds, figures = fit(f, off_topic_cost=0.0)
    assert figures["shares"]["reaction"] == 0.0
    thresholds, figures = fit(f, off_topic_cost=0.1)
    assert abs(thresholds.reply_matching) < 0.04
    assert abs(figures["shares"]["reaction"] - (f.reply_score < 0).mean()) < 0.02
    # The default cost is the lift of reply matching over the off-topic line; the sweep records its multiples.
    _, default = fit(f)
    assert default["off_topic_cost"] == round(f.judged["reply_matching"].mean() - 0.1, 4)
    sweep = default["reaction_share_by_cost"]
    assert sweep[0] == {"cost": 0.0, "share": 0.0} and sweep[2]["cost"] == default["off_topic_cost"]
    assert [s["share"] for s in sweep] == sorted(s["share"] for s in sweep)  # a dearer mistake, more reactions
