"""Which strategy answers each test turn under the served bundle's thresholds, and how well."""

from __future__ import annotations

from typing import Any

import numpy as np

from models.reactions.mining import ReactionKeys
from models.tables import cell
from models.walk import SOURCES, WalkFeatures, utility


def figures(
    f: WalkFeatures, chosen: np.ndarray, hit: np.ndarray, reaction_labels: list[str], replies: list[str]
) -> dict[str, Any]:
    """chosen: [N] the source per turn; hit: [N] reply matching's 1-of-100 R@1 per turn (after rerank).

    Per source: its share of turns; the judge cosine of its answers to the
    true replies and the share of them off topic; and how reply matching
    would have done on those same turns (off topic, R@1), which says how
    reliable retrieval was where each source answered."""
    truth = ReactionKeys.from_labels(reaction_labels).classify(replies)  # [N], -1: not a reaction
    predicted = np.array([reaction_labels.index(a) if a in reaction_labels else -2 for a in f.answers["reaction"]])
    off_topic = {s: f.judged[s] < f.off_topic_below for s in SOURCES}  # [N] each
    per_source = []
    for source in SOURCES:
        turns = chosen == source
        is_reaction = turns & (truth >= 0)

        def mean(values: np.ndarray, where: np.ndarray = turns) -> float | None:
            return round(float(values[where].mean()), 4) if where.any() else None

        per_source.append(
            {
                "source": source,
                "share": round(float(turns.mean()), 4),
                "judge_cosine": mean(f.judged[source]),
                "off_topic": mean(off_topic[source]),
                "reply_matching_off_topic": mean(off_topic["reply_matching"]),
                "reply_matching_r_at_1": mean(hit),
                "true_reply_is_reaction": round(float(is_reaction.sum() / max(1, turns.sum())), 4),
                "reaction_acc_at_1": mean(predicted == truth, is_reaction),
            }
        )
    return {
        "walk_judge_cosine": round(float(utility(f, chosen).mean()), 4),
        "off_topic_below": round(f.off_topic_below, 4),
        "walk_off_topic": round(float(sum(((chosen == s) & off_topic[s]).mean() for s in SOURCES[:2])), 4),
        "reply_matching_only_off_topic": round(float(off_topic["reply_matching"].mean()), 4),
        "reply_matching_only_judge_cosine": round(float(f.judged["reply_matching"].mean()), 4),
        # Served retrieved answers that are near copies of a turn of the context: 0 by construction.
        "served_echo_share": round(float(sum((chosen == s) & f.echo[s] for s in SOURCES[:2]).mean()), 4),
        # How often reply matching's top reply would have been one, without the echo check.
        "unfiltered_echo_share": round(float(f.unfiltered_echo.mean()), 4),
        "per_source": per_source,
    }


def markdown(walk: dict[str, Any], n: int) -> str:
    t = walk["thresholds"]
    lines = [
        f"Which source answers, on the same {n} test turns, for the served bundle {walk['bundle']} (query "
        f"similarity ≥ {t['query_similarity']}, reply matching's confidence ≥ {t['reply_matching']}: the "
        f"reaction share of {walk['reaction_share']:.0%} on validation). Judge: cosine between the answer and the "
        f"true reply under {walk['judge']}; the walk averages {walk['walk_judge_cosine']:.3f}, reply matching alone "
        f'{walk["reply_matching_only_judge_cosine"]:.3f}. "Off topic": judge cosine below '
        f"{walk['off_topic_below']:.3f}, no closer than another turn's answer usually is; the walk serves an "
        f"off-topic retrieved answer on {walk['walk_off_topic']:.3f} of turns, reply matching alone would on "
        f'{walk["reply_matching_only_off_topic"]:.3f}. "Reply matching there": how reply matching would have done '
        "on the turns each source took (off-topic share, 1-of-100 R@1).",
        "",
        "| source | share of turns | judge cosine | off topic | reply matching there: off topic | R@1 "
        "| true reply is a reaction | reaction accuracy@1 there |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in walk["per_source"]:
        lines.append(
            f"| {p['source']} | {p['share']:.3f} | {cell(p['judge_cosine'])} | {cell(p['off_topic'])} | "
            f"{cell(p['reply_matching_off_topic'])} | {cell(p['reply_matching_r_at_1'])} | "
            f"{p['true_reply_is_reaction']:.3f} | {cell(p['reaction_acc_at_1'])} |"
        )
    lines += [
        "",
        f"Echo: without the check, reply matching's top reply would be a near copy of a turn of the context on "
        f"{walk['unfiltered_echo_share']:.1%} of test turns; the service answered with one on "
        f"{walk['served_echo_share']:.1%}.",
    ]
    return "\n".join(lines) + "\n"
