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

from core import retriever
from core.bundle import Thresholds
from core.confidence import ConfidenceModel, features
from core.encoder import Encoder
from core.mood import TurnReading
from core.retriever import Avoid, Serving
from core.text import echoes

SOURCES = ("query_similarity", "reply_matching", "reaction")


@dataclass
class WalkFeatures:
    query_score: np.ndarray  # [N] cosine of the nearest stored query to the last turn
    reply_score: np.ndarray  # [N] top reply-matching score, reranked when the replay reranks
    reply_features: dict[str, np.ndarray]  # name -> [N], what the confidence model reads (`core.confidence`)
    answers: dict[str, list[str]]  # source -> [N] the text it would serve
    judged: dict[str, np.ndarray]  # source -> [N] judge cosine between its answer and the true reply
    has_reactions: bool
    # [N] judge cosine between reply matching's answer to another turn and this turn's true reply
    chance: np.ndarray
    echo: dict[str, np.ndarray]  # source -> [N] its answer is a near copy of a context turn (never, by design)
    unfiltered_echo: np.ndarray  # [N] reply matching's top reply would be one without the echo check

    @property
    def off_topic_below(self) -> float:
        """A retrieved answer under this judge cosine is no closer than chance usually is."""
        return float(np.median(self.chance))

    @property
    def acceptable(self) -> np.ndarray:
        """[N] reply matching's top reply is not off topic: what the confidence model predicts."""
        return np.asarray(self.judged["reply_matching"] >= self.off_topic_below)

    def matrix(self, names: list[str]) -> np.ndarray:
        """[N, F] the named confidence features."""
        return np.stack([self.reply_features[name] for name in names], axis=1)

    def confidence(self, model: ConfidenceModel | None) -> np.ndarray:
        """[N] the model's confidence per turn; without a model, the top score, as serving falls back to."""
        if model is None:
            return self.reply_score
        rows = [
            dict(zip(self.reply_features, values, strict=True))
            for values in zip(*self.reply_features.values(), strict=True)
        ]
        return np.array([model(row) for row in rows])

    @property
    def lift_over_chance(self) -> float:
        """How much closer reply matching's answers are, on average, than an off-topic one."""
        return float(self.judged["reply_matching"].mean() - self.off_topic_below)


def replay(
    serving: Serving,
    judge: Encoder,
    contexts: list[list[str]],
    replies: list[str],
    rerank_depth: int = 50,
    rerank: bool = False,
) -> WalkFeatures:
    """Runs each strategy on each turn with the serving code itself; `rerank`: as the
    service's default (Settings.rerank_by_default), so that what is calibrated is what serves."""
    encoder = serving.encoder
    last = encoder.encode([c[-1] for c in contexts], side=serving.index.manifest.query_side)  # [N, D]
    joined = [encoder.join_context(c) for c in contexts]
    poly = None
    if rerank and serving.reranker is not None:
        context, poly = encoder.encode_with_poly(joined)  # [N, D], [N, m, D]
    else:
        context = encoder.contexts(contexts, joined=serving.combiner is None)  # [N, D], as the service makes them
    # What the bundle's own reaction head reads: per turn, the last turn alone (as serving does).
    read = encoder.encode([c[-1] for c in contexts], side="context") if serving.combiner is not None else context
    n = len(contexts)
    query_score, reply_score = np.full(n, -1.0), np.full(n, -1.0)
    answers: dict[str, list[str]] = {s: [""] * n for s in SOURCES}
    rows: list[dict[str, float]] = []
    echo = {source: np.zeros(n, dtype=bool) for source in SOURCES}
    unfiltered_echo = np.zeros(n, dtype=bool)
    for i in range(n):
        window = contexts[i][-serving.bundle.max_context_turns :]
        avoid = Avoid.of(window)
        q = retriever.query_similarity(serving, last[i], 1, avoid, contexts[i][-1])
        r = retriever.reply_matching(serving, context[i], 1, avoid, None if poly is None else poly[i], rerank_depth)
        script = retriever.conversation_script(window)
        reading = TurnReading(window[-1], serving.reactions, read[i])
        x = retriever.reaction(serving, reading, context[i], 1, avoid, script)
        rows.append(features([h.score for h in r], window, r[0].text if r else ""))
        unfiltered = retriever.reply_matching(
            serving, context[i], 1, Avoid(), None if poly is None else poly[i], rerank_depth
        )
        unfiltered_echo[i] = bool(unfiltered) and echoes(unfiltered[0].text, list(avoid.turns))
        for source, hits in zip(SOURCES, (q, r), strict=False):
            echo[source][i] = bool(hits) and echoes(hits[0].text, list(avoid.turns))
        if q:
            query_score[i], answers["query_similarity"][i] = q[0].score, q[0].text
        if r:
            reply_score[i], answers["reply_matching"][i] = r[0].score, r[0].text
        if x:
            answers["reaction"][i] = x[0].text
    reply_features = {name: np.array([row[name] for row in rows]) for name in rows[0]}
    truth = judge.encode(replies, side="reply")  # [N, D]
    answer = {s: judge.encode(answers[s], side="reply") for s in SOURCES}  # [N, D] each
    judged = {s: (answer[s] * truth).sum(axis=1) for s in SOURCES}  # [N] each
    chance = (np.roll(answer["reply_matching"], 1, axis=0) * truth).sum(axis=1)  # [N]: a derangement
    has_reactions = serving.reactions is not None
    if not has_reactions:
        judged["reaction"] = np.full(n, -np.inf)  # never the better choice
    return WalkFeatures(
        query_score, reply_score, reply_features, answers, judged, has_reactions, chance, echo, unfiltered_echo
    )


def sources(f: WalkFeatures, thresholds: Thresholds, confidence: np.ndarray | None = None) -> np.ndarray:
    """[N] the source that answers each turn under `thresholds`, as `/reply` decides it.

    confidence: [N] what the reply-matching threshold applies to (default: the top score)."""
    sure = (f.reply_score if confidence is None else confidence) >= thresholds.reply_matching
    reply_or_reaction = np.where(sure | (not f.has_reactions), "reply_matching", "reaction")
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
