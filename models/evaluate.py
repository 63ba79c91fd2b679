"""`make eval`: every bundle on 1-of-100 test-split response selection, then
the served bundle's walk, confidence and reactions, into reports/.

    python -m models.evaluate [--bundle artifacts/bundles/multilingual-e5-chitchat-en-ko-int8]

Each table is a module of `models/tables/`. Every bundle's manifest gets its
figures (the files and the checksum do not change); the served bundle's
figures are what `models/release.py` checks against the gates.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.config import Settings
from app.engine.runtime import NotReady, load_newest_serving
from core.bundle import RELEASE_BUNDLE, list_bundles, open_bundle, update_manifest
from core.encoder import Encoder
from core.store import IndexStore
from models.evalset import EvalSet, eval_set
from models.hardware import hardware
from models.tables import confidence as confidence_table
from models.tables import reaction_table, retrieval, sources
from models.walk import replay
from models.walk import sources as walk_sources

# The default encoder's candidate (`make train-e5`); the release itself where none is built.
STUDENT = Path("artifacts/bundles/multilingual-e5-chitchat-en-ko-int8")
RELIABILITY_PLOT = "reliability.png"


def bundle_rows(bundles_root: Path, data: EvalSet, path: Path | None, depth: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{"model": "TF-IDF, last turn", **retrieval.tfidf_metrics(data, path)}]
    for bundle_dir, manifest in list_bundles(bundles_root):
        started = time.perf_counter()
        encoder = Encoder(bundle_dir, open_bundle(bundle_dir))
        figures = {
            **retrieval.bundle_figures(encoder, data, depth),
            **reaction_table.figures(bundle_dir, encoder, path),
            **retrieval.latency(encoder, data),
            "examples": len(data.replies),
        }
        update_manifest(bundle_dir, eval=figures)
        quantization = "int8" if "int8" in manifest.quantization else "fp32"  # "fused, int8-..." too
        rows.append({"model": manifest.name, "layers": manifest.num_layers, "quantization": quantization, **figures})
        print(f"[eval] {manifest.name}: {figures} ({time.perf_counter() - started:.0f}s)")
    return rows


def served_report(
    artifacts: Path, bundle_dir: Path, judge_dir: Path, data: EvalSet, out: Path
) -> dict[str, Any] | None:
    """The walk on test turns with the bundle's own thresholds, and what its confidence finds."""
    settings = Settings(artifacts_dir=artifacts, bundle_dir=bundle_dir)
    try:
        serving = load_newest_serving(settings, IndexStore(settings.indexes_root))
    except (NotReady, FileNotFoundError, ValueError) as error:
        print(f"[eval] no walk figures for {bundle_dir}: {error}")
        return None
    judge = Encoder(judge_dir, open_bundle(judge_dir))
    features = replay(serving, judge, data.contexts, data.replies, settings.rerank_depth, settings.rerank_by_default)
    confidence = features.confidence(serving.confidence)  # [N]
    chosen = walk_sources(features, serving.thresholds, confidence)  # [N]
    bi, reranked = retrieval.bundle_ranks(serving.encoder, data, settings.rerank_depth)
    hit = (reranked if reranked is not None else bi) == 1  # [N] reply matching's 1-of-100 R@1 per turn
    labels = serving.reactions.labels if serving.reactions is not None else []
    report: dict[str, Any] = {
        "bundle": serving.bundle.name,
        "thresholds": asdict(serving.thresholds),
        "reaction_share": settings.reaction_share,
        "judge": judge.manifest.name,
        **sources.figures(features, chosen, hit, labels, data.replies),
    }
    if serving.confidence is not None:
        report["confidence"] = confidence_table.figures(serving.confidence, confidence, features.acceptable, hit)
        confidence_table.plot(report["confidence"], out / RELIABILITY_PLOT)
    return report


def served_summary(walk: dict[str, Any], share: float) -> dict[str, Any]:
    """The walk figures a release is judged on, for the bundle's manifest."""
    summary: dict[str, Any] = {
        "served_echo_share": walk["served_echo_share"],
        "unfiltered_echo_share": walk["unfiltered_echo_share"],
        "source_shares": {p["source"]: p["share"] for p in walk["per_source"]},
    }
    if "confidence" in walk:
        summary["confidence_auroc"] = walk["confidence"]["auroc"]
        at_share = next(r for r in walk["confidence"]["fallback"] if r["validation_share"] == share)
        summary["fallback_r_at_1_handed_to_reactions"] = at_share["r_at_1_handed_to_reactions"]
        summary["fallback_r_at_1_kept"] = at_share["r_at_1_kept"]
    return summary


def evaluate_all(
    artifacts: Path, out: Path, n: int, seed: int, bundle: Path, judge: Path, path: Path | None = None
) -> dict[str, Any]:
    depth = Settings().rerank_depth
    data = eval_set(n, seed, path=path, max_context_turns=8)  # the joined way reads the last 3 of them
    rows = bundle_rows(artifacts / "bundles", data, path, depth)
    out.mkdir(parents=True, exist_ok=True)
    walk = served_report(artifacts, bundle, judge, data, out) if judge.is_dir() else None
    markdown = retrieval.markdown(rows, len(data.replies)) + "\n" + reaction_table.markdown(rows)
    if walk is not None:
        markdown += "\n" + sources.markdown(walk, len(data.replies))
        if "confidence" in walk:
            markdown += "\n" + confidence_table.markdown(walk["confidence"], RELIABILITY_PLOT)
        manifest = open_bundle(bundle)
        update_manifest(bundle, eval={**manifest.eval, **served_summary(walk, walk["reaction_share"])})
    # The latency column is this machine's: the report names it (int8 runs 2-3x apart with and without VNNI).
    machine = hardware("cpu")
    markdown = f"On {machine['cpu']} {'with' if machine['vnni'] else 'without'} VNNI.\n\n" + markdown
    report = {"examples": len(data.replies), "seed": seed, "hardware": machine, "rows": rows, "served": walk}
    (out / "eval.json").write_text(json.dumps(report, indent=2))
    (out / "eval.md").write_text(markdown)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--bundle", type=Path, help="the bundle whose walk to report (default: the trained student)")
    parser.add_argument("--out", type=Path, default=Path("reports"))
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--judge", type=Path, default=Path("artifacts/bundles/minilm-l6-zeroshot-int8"))
    args = parser.parse_args()
    bundle = args.bundle or (STUDENT if STUDENT.is_dir() else RELEASE_BUNDLE)
    evaluate_all(args.artifacts, args.out, args.examples, args.seed, bundle, args.judge)
    print((args.out / "eval.md").read_text())


if __name__ == "__main__":
    main()
