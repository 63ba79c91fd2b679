"""Fits the thresholds of the strategy walk on the validation split.

    python -m models.calibrate [--bundle DIR]   # default: the bundle the service would serve

Objective (see `models/walk.py`), over held-out validation turns: the mean
judge cosine between the answer `/reply` would give and the reply the person
actually sent, less `off_topic_cost` for every retrieved answer that is off
topic. By default an off-topic answer costs what an average retrieved answer
gains over an off-topic one (`WalkFeatures.lift_over_chance`): one bad reply
undoes one ordinary good one. How much off-topic risk to trade for generic
replies is a product call; `--off-topic-cost` makes it, and the manifest
records, for a range of costs, the share each would give reactions.

Query similarity answers when its cosine reaches `query_similarity`;
otherwise reply matching answers when its score reaches `reply_matching`;
otherwise a reaction does. Every pair of thresholds on a grid of score
quantiles is tried and the best one is written, with the figures behind it,
into the bundle's manifest. The encoder files and the checksum do not
change, so the index built for the bundle stays valid.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from app.config import Settings
from app.engine.bundle import MANIFEST, Thresholds, read_manifest
from app.engine.encoder import Encoder
from app.engine.runtime import load_serving
from index.store import IndexStore
from models.evaluate import eval_set
from models.walk import SOURCES, WalkFeatures, replay, shares, source_utility, sources, utility

OBJECTIVE = (
    "mean judge cosine between the served answer and the true next turn, less off_topic_cost for each "
    "retrieved answer below off_topic_below (validation split)"
)
COST_SWEEP = (0.0, 0.5, 1.0, 2.0, 4.0)  # multiples of the default cost whose reaction share is recorded
NEVER, ALWAYS = 1.01, -1.0  # thresholds no cosine reaches / every cosine reaches


def _grid(scores: np.ndarray, extra: float) -> np.ndarray:
    return np.unique(np.round(np.append(np.quantile(scores, np.linspace(0, 1, 101)), extra), 4))


def _best(f: WalkFeatures, off_topic_cost: float) -> tuple[float, Thresholds]:
    """The grid point with the highest mean utility; ties go to the lowest thresholds."""
    by_source = {s: source_utility(f, s, off_topic_cost) for s in SOURCES}  # [N] each
    if not f.has_reactions:
        by_source["reaction"] = by_source["reply_matching"]  # sources() never picks a reaction then
    reply_grid = _grid(f.reply_score, ALWAYS) if f.has_reactions else np.array([ALWAYS])
    reaches = (f.reply_score[None, :] >= reply_grid[:, None]).astype(np.float64)  # [R, N]
    gain = by_source["reply_matching"] - by_source["reaction"]  # [N] reply matching's gain where it answers
    best: tuple[float, Thresholds] | None = None
    for tq in _grid(f.query_score, NEVER):
        by_query = f.query_score >= tq  # [N]
        base = by_source["query_similarity"][by_query].sum() + by_source["reaction"][~by_query].sum()
        totals = base + reaches @ np.where(by_query, 0.0, gain)  # [R]
        i = int(np.argmax(totals))
        value = float(totals[i]) / len(gain)
        if best is None or value > best[0]:
            best = (value, Thresholds(query_similarity=float(tq), reply_matching=float(reply_grid[i])))
    assert best is not None
    return best


def fit(f: WalkFeatures, off_topic_cost: float | None = None) -> tuple[Thresholds, dict[str, Any]]:
    """The best thresholds under `off_topic_cost` (default: f.lift_over_chance) and the figures behind them."""
    default_cost = max(0.0, f.lift_over_chance)
    cost = default_cost if off_topic_cost is None else off_topic_cost
    value, thresholds = _best(f, cost)
    baselines = {
        "reply_matching_only": Thresholds(NEVER, ALWAYS),
        "query_similarity_then_reply_matching": Thresholds(thresholds.query_similarity, ALWAYS),
    }
    chosen = sources(f, thresholds)  # [N]
    figures: dict[str, Any] = {
        "objective": OBJECTIVE,
        "off_topic_cost": round(cost, 4),
        "off_topic_below": round(f.off_topic_below, 4),
        "value": round(value, 4),
        "mean_judge_cosine": round(float(utility(f, chosen).mean()), 4),
        "shares": shares(chosen),
        "baselines": {k: round(float(utility(f, sources(f, t), cost).mean()), 4) for k, t in baselines.items()},
    }
    if f.has_reactions:
        figures["reaction_share_by_cost"] = [
            {"cost": round(default_cost * m, 4), "share": shares(sources(f, _best(f, default_cost * m)[1]))["reaction"]}
            for m in COST_SWEEP
        ]
    return thresholds, figures


def calibrate(
    artifacts: Path,
    judge_dir: Path,
    examples: int,
    seed: int,
    data_path: Path | None = None,
    bundle_dir: Path | None = None,
    off_topic_cost: float | None = None,
) -> dict[str, Any]:
    """Fits and writes the thresholds of `bundle_dir`, or of the bundle the service would pick."""
    started = time.perf_counter()
    settings = Settings(artifacts_dir=artifacts, bundle_dir=bundle_dir)
    serving = load_serving(settings, IndexStore(settings.indexes_root))
    data = eval_set(examples, seed, "validation", data_path)
    judge = Encoder(judge_dir, read_manifest(judge_dir))
    features = replay(serving, judge, data.contexts, data.replies, settings.rerank_depth)
    thresholds, figures = fit(features, off_topic_cost)
    figures.update({"examples": len(data.replies), "seed": seed, "judge": read_manifest(judge_dir).name})
    path = serving.bundle_dir / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["thresholds"] = asdict(thresholds)
    manifest["calibration"] = figures
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"[calibrate] {serving.bundle.name}: {asdict(thresholds)} {figures} ({time.perf_counter() - started:.0f}s)")
    return {"bundle": serving.bundle.name, "thresholds": asdict(thresholds), **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--bundle", type=Path, help="bundle directory (default: the one the service would serve)")
    parser.add_argument("--judge", type=Path, default=Path("artifacts/bundles/minilm-l6-zeroshot-int8"))
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)  # not the test set's seed 0, though the splits differ anyway
    parser.add_argument("--off-topic-cost", type=float, help="judge-cosine cost of an off-topic retrieved answer")
    args = parser.parse_args()
    calibrate(
        args.artifacts, args.judge, args.examples, args.seed, bundle_dir=args.bundle, off_topic_cost=args.off_topic_cost
    )


if __name__ == "__main__":
    main()
