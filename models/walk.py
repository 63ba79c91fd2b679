"""The strategy walk of `/reply`, replayed on held-out turns.

For every turn all three strategies answer, so any pair of thresholds can be
applied afterwards in numpy: `models/calibrate.py` searches them on the
validation split and `models/evaluate.py` reports, on the test split, which
source answered each turn and how well.

What "well" means: no one labelled which stored reply is acceptable after a
turn, so an answer is judged by its cosine to the reply the person actually
sent, under a judge encoder that is not the served model (by default the
zero-shot all-MiniLM-L6-v2, a general sentence-similarity model).
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
    judged = {s: (judge.encode(answers[s], side="reply") * truth).sum(axis=1) for s in SOURCES}  # [N] each
    has_reactions = serving.reactions is not None
    if not has_reactions:
        judged["reaction"] = np.full(n, -np.inf)  # never the better choice
    return WalkFeatures(query_score, reply_score, answers, judged, has_reactions)


def sources(f: WalkFeatures, thresholds: Thresholds) -> np.ndarray:
    """[N] the source that answers each turn under `thresholds`, as `/reply` decides it."""
    reply_or_reaction = np.where(
        (f.reply_score >= thresholds.reply_matching) | (not f.has_reactions), "reply_matching", "reaction"
    )
    return np.where(f.query_score >= thresholds.query_similarity, "query_similarity", reply_or_reaction)


def utility(f: WalkFeatures, chosen: np.ndarray) -> np.ndarray:
    """[N] judge cosine of the answer each turn gets."""
    out = np.empty(len(chosen))
    for s in SOURCES:
        out[chosen == s] = f.judged[s][chosen == s]
    return out


def shares(chosen: np.ndarray) -> dict[str, float]:
    return {s: round(float((chosen == s).mean()), 4) for s in SOURCES}
