"""How well the reaction classifier names the reaction a person sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from core.encoder import Encoder
from core.reactions import ReactionClassifier
from index.corpus import load_pairs
from models.reactions.mining import ReactionKeys


def figures(bundle_dir: Path, encoder: Encoder, path: Path | None = None) -> dict[str, float]:
    """Accuracy@1 and @5 on every test turn whose true reply is one of the bundle's reactions."""
    m = encoder.manifest
    if m.reactions is None:
        return {}
    classifier = ReactionClassifier.load(bundle_dir, m.reactions, encoder)
    pairs = load_pairs("test", m.max_context_turns, path)
    labels = ReactionKeys.from_labels(m.reactions.labels).classify([p.reply for p in pairs])  # [N]
    windows = [list(p.context) for p, label in zip(pairs, labels, strict=True) if label >= 0]
    if not windows:
        return {}
    # What the head reads as served: per turn, the last turn alone; joined, the window's vector.
    read = encoder.encode([w[-1] for w in windows], "context") if encoder.combiner else encoder.contexts(windows)
    probs = classifier.probabilities(read)  # [M, C]
    truth = labels[labels >= 0]  # [M]
    rank = 1 + (probs > probs[np.arange(len(truth)), truth][:, None]).sum(axis=1)  # [M]
    return {
        "reaction_acc_at_1": round(float((rank == 1).mean()), 4),
        "reaction_acc_at_5": round(float((rank <= 5).mean()), 4),
        "reaction_examples": len(truth),
        "reaction_share_of_test_replies": round(len(truth) / len(pairs), 4),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    reacting = [r for r in rows if "reaction_acc_at_1" in r]
    if not reacting:
        return ""
    lines = [
        "Reactions: accuracy on every test turn whose true reply is one of the bundle's reaction classes.",
        "",
        "| model | accuracy@1 | accuracy@5 | test turns | share of test replies |",
        "|---|---|---|---|---|",
    ]
    for r in reacting:
        lines.append(
            f"| {r['model']} | {r['reaction_acc_at_1']:.3f} | {r['reaction_acc_at_5']:.3f} | "
            f"{r['reaction_examples']} | {r['reaction_share_of_test_replies']:.3f} |"
        )
    return "\n".join(lines) + "\n"
