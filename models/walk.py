"""The strategy walk of `/reply`, replayed on held-out turns.

For every turn all three strategies answer, so any pair of thresholds can be
applied afterwards in numpy: `models/calibrate.py` searches them on the
validation split and `models/evaluate.py` reports, on the test split, which
source answered each turn and how well.

What "well" means: no one labelled which stored reply is acceptable after a
turn, so an answer is judged by its cosine to the reply the person actually
sent, under a judge encoder that is not the served model (by default the
zero-shot all-MiniLM-L6-v2, a general sentence-similarity model).

Judged by that mean alone, a reaction almost never beats a retrieved reply,
even a wrong one: "haha" is far from most true replies too. But a wrong
specific reply is worse for a user than a generic one, and the mean cannot
say so. So a retrieved answer that is off topic, no closer to the true reply
than another turn's answer usually is, also pays `off_topic_cost`. A
reaction commits to no topic and pays nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine import retriever
from app.engine.bundle import Thresholds
from app.engine.encoder import Encoder
from app.engine.retriever import Serving

SOURCES = ("query_similarity", "reply_matching", "reaction")


@dataclass
class WalkFeatures:
    query_score: np.ndarray  # [N] cosine of the nearest stored query to the last turn
    reply_score: np.ndarray  # [N] top reply-matching score, reranked when the bundle has a poly head
    answers: dict[str, list[str]]  # source -> [N] the text it would serve
    judged: dict[str, np.ndarray]  # source -> [N] judge cosine between its answer and the true reply
    has_reactions: bool
    # [N] judge cosine between reply matching's answer to another turn and this turn's true reply
    chance: np.ndarray

    @property
    def off_topic_below(self) -> float:
        """A retrieved answer under this judge cosine is no closer than chance usually is."""
        return float(np.median(self.chance))

    @property
    def lift_over_chance(self) -> float:
        """How much closer reply matching's answers are, on average, than an off-topic one."""
        return float(self.judged["reply_matching"].mean() - self.off_topic_below)


def replay(
    serving: Serving, judge: Encoder, contexts: list[list[str]], replies: list[str], rerank_depth: int = 50
) -> WalkFeatures:
    """Runs each strategy on each turn with the serving code itself."""
    encoder = serving.encoder
    last = encoder.encode([c[-1] for c in contexts], side="context")  # [N, D]
    joined = [encoder.join_context(c) for c in contexts]
    poly = None
    if serving.reranker is not None:
        context, poly = encoder.encode_with_poly(joined)  # [N, D], [N, m, D]
    else:
        context = encoder.encode(joined, side="context")  # [N, D]
    n = len(contexts)
    query_score, reply_score = np.full(n, -1.0), np.full(n, -1.0)
    answers: dict[str, list[str]] = {s: [""] * n for s in SOURCES}
    for i in range(n):
        q = retriever.query_similarity(serving, last[i], 1, set())
        r = retriever.reply_matching(serving, context[i], 1, set(), None if poly is None else poly[i], rerank_depth)
        x = retriever.reaction(serving, context[i], 1, set())
        if q:
            query_score[i], answers["query_similarity"][i] = q[0].score, q[0].text
        if r:
            reply_score[i], answers["reply_matching"][i] = r[0].score, r[0].text
        if x:
            answers["reaction"][i] = x[0].text
    truth = judge.encode(replies, side="reply")  # [N, D]
    answer = {s: judge.encode(answers[s], side="reply") for s in SOURCES}  # [N, D] each
    judged = {s: (answer[s] * truth).sum(axis=1) for s in SOURCES}  # [N] each
    chance = (np.roll(answer["reply_matching"], 1, axis=0) * truth).sum(axis=1)  # [N]: a derangement
    has_reactions = serving.reactions is not None
    if not has_reactions:
        judged["reaction"] = np.full(n, -np.inf)  # never the better choice
    return WalkFeatures(query_score, reply_score, answers, judged, has_reactions, chance)


def sources(f: WalkFeatures, thresholds: Thresholds) -> np.ndarray:
    """[N] the source that answers each turn under `thresholds`, as `/reply` decides it."""
    reply_or_reaction = np.where(
        (f.reply_score >= thresholds.reply_matching) | (not f.has_reactions), "reply_matching", "reaction"
    )
    return np.where(f.query_score >= thresholds.query_similarity, "query_similarity", reply_or_reaction)


def source_utility(f: WalkFeatures, source: str, off_topic_cost: float = 0.0) -> np.ndarray:
    """[N] what each turn would score if `source` answered it."""
    judged = f.judged[source]
    if source == "reaction":
        return judged
    return judged - off_topic_cost * (judged < f.off_topic_below)


def utility(f: WalkFeatures, chosen: np.ndarray, off_topic_cost: float = 0.0) -> np.ndarray:
    """[N] what each turn scores with the source `chosen` for it."""
    out = np.empty(len(chosen))
    for s in SOURCES:
        out[chosen == s] = source_utility(f, s, off_topic_cost)[chosen == s]
    return out


def shares(chosen: np.ndarray) -> dict[str, float]:
    return {s: round(float((chosen == s).mean()), 4) for s in SOURCES}
