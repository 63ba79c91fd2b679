"""Does the confidence find the turns where reply matching is unreliable?

- AUROC of the confidence against "reply matching's top reply is acceptable"
  (judge cosine at or above the off-topic line), on test turns;
- a reliability plot: predicted against observed, saved as a PNG;
- the fallback: reply matching's 1-of-100 R@1 on the turns a reaction share
  hands to reactions, against the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from core.confidence import ConfidenceModel
from models.confidence_fit import auroc
from models.tables import cell

SHARES = (0.05, 0.10, 0.20, 0.30)
BINS = 10


def figures(model: ConfidenceModel, confidence: np.ndarray, acceptable: np.ndarray, hit: np.ndarray) -> dict[str, Any]:
    """confidence, acceptable, hit: [N] per test turn; hit is reply matching's 1-of-100 R@1."""
    edges = np.linspace(0, 1, BINS + 1)
    which = np.clip(np.digitize(confidence, edges) - 1, 0, BINS - 1)  # [N]
    reliability = [
        {
            "bin": [round(float(edges[b]), 2), round(float(edges[b + 1]), 2)],
            "turns": int((which == b).sum()),
            "predicted": round(float(confidence[which == b].mean()), 4) if (which == b).any() else None,
            "observed": round(float(acceptable[which == b].mean()), 4) if (which == b).any() else None,
        }
        for b in range(BINS)
    ]
    fallback = []
    for share in SHARES:
        low = confidence < model.threshold_for_share(share)  # [N]: the turns this share hands to reactions
        on, rest = hit[low], hit[~low]
        fallback.append(
            {
                "validation_share": share,
                "test_share": round(float(low.mean()), 4),
                "r_at_1_handed_to_reactions": round(float(on.mean()), 4) if len(on) else None,
                "r_at_1_kept": round(float(rest.mean()), 4) if len(rest) else None,
            }
        )
    return {
        "auroc": round(auroc(acceptable, confidence), 4),
        "acceptable": round(float(acceptable.mean()), 4),
        "features": model.spec.features,
        "reliability": reliability,
        "fallback": fallback,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """The reliability diagram: each bin's mean confidence against how often its top reply was acceptable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = [b for b in report["reliability"] if b["turns"]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5, 6), height_ratios=(3, 1), sharex=True)
    top.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfectly calibrated")
    top.plot([b["predicted"] for b in bins], [b["observed"] for b in bins], marker="o", label="confidence")
    top.set_ylabel("observed: top reply acceptable")
    top.set_title(f"Reply-matching confidence, test turns\n(AUROC {report['auroc']:.3f})", fontsize=11)
    top.legend(loc="upper left")
    bottom.bar([sum(b["bin"]) / 2 for b in bins], [b["turns"] for b in bins], width=1 / BINS * 0.9)
    bottom.set_xlabel("predicted confidence")
    bottom.set_ylabel("turns")
    bottom.set_xlim(0, 1)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(report: dict[str, Any], plot_name: str) -> str:
    lines = [
        f'Confidence: AUROC {report["auroc"]:.3f} for "reply matching\'s top reply is acceptable" (judge cosine at '
        f"or above the off-topic line; {report['acceptable']:.1%} of test turns are), from "
        f"{', '.join(report['features'])}. Reliability plot: `{plot_name}`.",
        "",
        "Reply matching's 1-of-100 R@1 on the turns a reaction share hands to reactions (the least confident), "
        "against the turns it keeps:",
        "",
        "| share on validation | share on test | R@1 handed to reactions | R@1 kept | ratio |",
        "|---|---|---|---|---|",
    ]
    for row in report["fallback"]:
        on, kept = row["r_at_1_handed_to_reactions"], row["r_at_1_kept"]
        ratio = on / kept if on is not None and kept else None
        shares = f"{row['validation_share']:.2f} | {row['test_share']:.3f}"
        lines.append(f"| {shares} | {cell(on)} | {cell(kept)} | {cell(ratio, '{:.2f}')} |")
    return "\n".join(lines) + "\n"
