"""Fits the confidence model and the thresholds of the strategy walk on the validation split.

    python -m models.calibrate --bundle DIR [--reaction-share 0.10]

1. Every validation turn is answered by all three strategies with the serving
   code (`models/walk.py`), and each answer is judged against the reply the
   person sent.
2. The confidence model (`models/confidence_fit.py`) learns, from features of
   reply matching's hits, whether its top reply is acceptable.
3. Reply matching's threshold is the product call: the least confident
   `reaction_share` of turns (10% by default) go to reactions. The manifest
   keeps the confidence quantiles, so the service turns any share
   (`CHITCHAT_REACTION_SHARE`) into a threshold without refitting.
4. Query similarity's threshold is fitted: on a grid of its score quantiles,
   the one with the best mean judge cosine, less `off_topic_cost` for each
   off-topic retrieved answer (a reaction commits to no topic and pays
   nothing). By default an off-topic answer costs what an average retrieved
   answer gains over an off-topic one: one bad reply undoes one good one.

The thresholds and the figures behind them go into the bundle's manifest;
the encoder files and the checksum do not change, so the index stays valid.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from app.config import Settings
from app.engine.runtime import load_newest_serving
from core.bundle import JoinedWay, Thresholds, open_bundle, update_manifest
from core.confidence import ConfidenceModel
from core.encoder import Encoder
from core.store import IndexStore
from models import confidence_fit as fitting
from models.evalset import eval_set
from models.walk import SOURCES, WalkFeatures, replay, shares, source_utility, sources, utility

OBJECTIVE = (
    "mean judge cosine between the served answer and the true next turn, less off_topic_cost for each "
    "retrieved answer below off_topic_below (validation split)"
)
DEFAULT_REACTION_SHARE = 0.10
NEVER, ALWAYS = 1.01, -1.0  # thresholds no cosine reaches / every cosine reaches


def fit_query_threshold(f: WalkFeatures, replies: np.ndarray, off_topic_cost: float) -> tuple[float, float]:
    """(mean utility, threshold) of the best query-similarity threshold on a quantile grid.

    replies: [N] whether reply matching (rather than a reaction) takes a turn that query similarity leaves."""
    by_source = {s: source_utility(f, s, off_topic_cost) for s in SOURCES}  # [N] each
    rest = np.where(replies, by_source["reply_matching"], by_source["reaction"])  # [N]
    grid = np.unique(np.round(np.append(np.quantile(f.query_score, np.linspace(0, 1, 101)), NEVER), 4))
    values = [float(np.where(f.query_score >= t, by_source["query_similarity"], rest).mean()) for t in grid]
    best = int(np.argmax(values))  # the first, lowest threshold on a tie
    return values[best], float(grid[best])


def fit(
    f: WalkFeatures, reaction_share: float = DEFAULT_REACTION_SHARE, off_topic_cost: float | None = None
) -> tuple[Thresholds, Any, dict[str, Any]]:
    """Thresholds, the confidence spec, and the figures behind them."""
    names = list(f.reply_features)
    spec = fitting.fit(f.matrix(names), f.acceptable, names)
    model = ConfidenceModel(spec)
    confidence = f.confidence(model)  # [N]
    reply_threshold = model.threshold_for_share(reaction_share) if f.has_reactions else ALWAYS
    replies = (confidence >= reply_threshold) | (not f.has_reactions)  # [N]
    cost = max(0.0, f.lift_over_chance) if off_topic_cost is None else off_topic_cost
    value, query_threshold = fit_query_threshold(f, replies, cost)
    thresholds = Thresholds(query_similarity=query_threshold, reply_matching=round(reply_threshold, 6))
    chosen = sources(f, thresholds, confidence)  # [N]
    figures: dict[str, Any] = {
        "objective": OBJECTIVE,
        "reaction_share": reaction_share,
        "off_topic_cost": round(cost, 4),
        "off_topic_below": round(f.off_topic_below, 4),
        "value": round(value, 4),
        "mean_judge_cosine": round(float(utility(f, chosen).mean()), 4),
        "shares": shares(chosen),
        "acceptable": round(float(f.acceptable.mean()), 4),
        "confidence_auroc": spec.auroc,
        "baselines": {
            "reply_matching_only": round(float(utility(f, sources(f, Thresholds(NEVER, ALWAYS)), cost).mean()), 4),
        },
    }
    return thresholds, spec, figures


def calibrate(
    artifacts: Path,
    bundle_dir: Path,
    judge_dir: Path,
    examples: int,
    seed: int,
    data_path: Path | None = None,
    reaction_share: float = DEFAULT_REACTION_SHARE,
    off_topic_cost: float | None = None,
    joined: bool = False,
) -> dict[str, Any]:
    """Fits and writes the thresholds and the confidence model of `bundle_dir`, for the way it serves
    contexts: per turn where it has a combiner, unless `joined` (then into its manifest's `joined`)."""
    started = time.perf_counter()
    settings = Settings(artifacts_dir=artifacts, bundle_dir=bundle_dir, joined_context=joined)
    serving = load_newest_serving(settings, IndexStore(settings.indexes_root))
    turns = max(3, serving.combiner.turns if serving.combiner else 0)  # every turn the context vector reads
    data = eval_set(examples, seed, "validation", data_path, max_context_turns=turns)
    judge = Encoder(judge_dir, open_bundle(judge_dir))
    features = replay(serving, judge, data.contexts, data.replies, settings.rerank_depth, settings.rerank_by_default)
    thresholds, spec, figures = fit(features, reaction_share, off_topic_cost)
    figures.update({"examples": len(data.replies), "seed": seed, "judge": judge.manifest.name})
    if serving.combiner is None and serving.bundle.combiner is not None:
        update_manifest(bundle_dir, joined=JoinedWay(thresholds, spec, figures))
    else:
        update_manifest(bundle_dir, thresholds=thresholds, confidence=spec, calibration=figures)
    print(f"[calibrate] {serving.bundle.name}: {asdict(thresholds)} {figures} ({time.perf_counter() - started:.0f}s)")
    return {"bundle": serving.bundle.name, "thresholds": asdict(thresholds), **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--bundle", type=Path, required=True, help="bundle directory, with an index built")
    parser.add_argument("--judge", type=Path, default=Path("artifacts/bundles/minilm-l6-zeroshot-int8"))
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)  # not the test set's seed 0, though the splits differ anyway
    parser.add_argument("--reaction-share", type=float, default=DEFAULT_REACTION_SHARE)
    parser.add_argument("--off-topic-cost", type=float, help="judge-cosine cost of an off-topic retrieved answer")
    parser.add_argument("--joined", action="store_true", help="a bundle with a combiner: fit its joined way")
    args = parser.parse_args()
    calibrate(
        args.artifacts,
        args.bundle,
        args.judge,
        args.examples,
        args.seed,
        reaction_share=args.reaction_share,
        off_topic_cost=args.off_topic_cost,
        joined=args.joined,
    )


if __name__ == "__main__":
    main()
