"""The confidence model and the walk's thresholds, on synthetic turns with known answers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from core.confidence import ConfidenceModel
from models.calibrate import ALWAYS, fit
from models.confidence_fit import auroc
from models.confidence_fit import fit as fit_confidence
from models.walk import WalkFeatures, sources


def walk(has_reactions: bool = True, n: int = 2000, seed: int = 0) -> WalkFeatures:
    """Reply matching's top reply is acceptable with a probability that rises with its score."""
    rng = np.random.default_rng(seed)
    query_score = rng.uniform(0, 1, n)  # [N]
    reply_score = rng.uniform(-1, 1, n)  # [N]
    acceptable = rng.uniform(0, 1, n) < 1 / (1 + np.exp(-6 * reply_score))  # [N]
    judged = {
        "query_similarity": np.where(query_score >= 0.8, 0.9, 0.1),  # good only when very sure
        "reply_matching": np.where(acceptable, 0.5, 0.0),
        "reaction": np.full(n, 0.2) if has_reactions else np.full(n, -np.inf),
    }
    return WalkFeatures(
        query_score=query_score,
        reply_score=reply_score,
        reply_features={"top1": reply_score, "noise": rng.normal(size=n)},
        answers={s: [""] * n for s in judged},
        judged=judged,
        has_reactions=has_reactions,
        chance=np.full(n, 0.1),  # off topic below 0.1: exactly the unacceptable replies
        echo={s: np.zeros(n, dtype=bool) for s in judged},
        unfiltered_echo=np.zeros(n, dtype=bool),
    )


def test_auroc_counts_ordered_pairs_and_ties_as_half() -> None:
    rng = np.random.default_rng(1)
    labels = rng.uniform(size=300) < 0.3
    scores = np.round(rng.normal(size=300), 1)  # rounded: plenty of ties
    pairs = [(p, q) for p, q in itertools.product(scores[labels], scores[~labels])]
    brute = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in pairs) / len(pairs)
    assert auroc(labels, scores) == pytest.approx(brute)
    assert auroc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
    assert auroc(np.array([1, 1, 0, 0]), np.array([0.1, 0.2, 0.3, 0.4])) == 0.0


def test_confidence_learns_the_informative_feature_and_serving_computes_the_same() -> None:
    f = walk()
    spec = fit_confidence(f.matrix(["top1", "noise"]), f.acceptable, ["top1", "noise"])
    assert spec.weight[0] > 1.0 and abs(spec.weight[1]) < 0.2  # the score matters, the noise does not
    assert spec.auroc > 0.8
    model = ConfidenceModel(spec)
    rows = zip(f.reply_score, f.reply_features["noise"], strict=True)
    served = np.array([model({"top1": t, "noise": z}) for t, z in rows])
    assert auroc(f.acceptable, served) == pytest.approx(spec.auroc, abs=1e-4)
    assert spec.quantiles == sorted(spec.quantiles) and len(spec.quantiles) == 101
    # Calibrated on average: the mean confidence is the acceptable share.
    assert served.mean() == pytest.approx(f.acceptable.mean(), abs=0.01)


@pytest.mark.parametrize("share", [0.05, 0.1, 0.3])
def test_the_reaction_share_sends_the_least_confident_turns_to_reactions(share: float) -> None:
    f = walk()
    f.judged["query_similarity"][:] = -1.0  # out of the way: the choice is reply matching or a reaction
    thresholds, spec, figures = fit(f, reaction_share=share)
    assert thresholds.query_similarity > 1.0  # never worth it here
    confidence = f.confidence(ConfidenceModel(spec))
    chosen = sources(f, thresholds, confidence)
    assert figures["shares"]["reaction"] == pytest.approx(share, abs=0.01)
    assert confidence[chosen == "reaction"].max() <= confidence[chosen == "reply_matching"].min()


def test_the_query_threshold_is_fitted_where_query_similarity_is_good() -> None:
    thresholds, _, figures = fit(walk(), off_topic_cost=0.0)
    assert abs(thresholds.query_similarity - 0.8) < 0.02
    assert figures["value"] > figures["baselines"]["reply_matching_only"]


def test_without_reactions_reply_matching_takes_every_turn_query_similarity_leaves() -> None:
    thresholds, _, figures = fit(walk(has_reactions=False))
    assert thresholds.reply_matching == ALWAYS
    assert figures["shares"]["reaction"] == 0.0
