"""The retrieval strategies over one (bundle, index version) snapshot.

Pure CPU code with no I/O: the caller runs it off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from app.engine.bundle import BundleManifest
from app.engine.encoder import Encoder
from app.engine.reactions import ReactionClassifier
from app.engine.reranker import PolyReranker
from app.engine.text import normalize
from index.store import IndexVersion

Strategy = Literal["query_similarity", "reply_matching", "reaction"]

# Quality falls and coverage rises along this order (DESIGN.md).
STRATEGY_ORDER: tuple[Strategy, ...] = ("query_similarity", "reply_matching", "reaction")


@dataclass(frozen=True)
class Serving:
    """What one request uses from start to end; swapped as a whole."""

    bundle: BundleManifest
    bundle_dir: Path
    encoder: Encoder
    index: IndexVersion
    reranker: PolyReranker | None = None  # the bundle's poly head, if it has one
    reactions: ReactionClassifier | None = None  # the bundle's reaction classifier, if it has one

    @property
    def index_version(self) -> str:
        return self.index.version


@dataclass(frozen=True)
class Scored:
    reply_row: int  # -1 for a reaction, which is not an index row
    id: str
    text: str
    score: float
    source: Strategy


def _search(index: object, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    # vector: [D] -> scores [k], rows [k]; FAISS pads missing hits with row -1
    scores, rows = index.search(vector[None, :], k)  # type: ignore[attr-defined]
    keep = rows[0] >= 0
    return scores[0][keep], rows[0][keep]


def _distinct(hits: list[Scored], k: int, exclude: set[str]) -> list[Scored]:
    """First hit per reply, skipping excluded reply texts (normalised)."""
    seen: set[int] = set()
    out = []
    for hit in hits:
        if hit.reply_row in seen or normalize(hit.text) in exclude:
            continue
        seen.add(hit.reply_row)
        out.append(hit)
        if len(out) == k:
            break
    return out


def query_similarity(serving: Serving, query_vector: np.ndarray, k: int, exclude: set[str]) -> list[Scored]:
    """Stored queries nearest to the last utterance -> the replies paired with them."""
    index = serving.index
    # Several stored queries can share a reply, and excluded replies are
    # dropped afterwards, so over-fetch.
    scores, rows = _search(index.query_index, query_vector, 2 * k + len(exclude))
    hits = []
    for score, row in zip(scores.tolist(), rows.tolist(), strict=True):
        reply_row = int(index.query_reply_rows[row])
        hits.append(
            Scored(reply_row, index.reply_ids[reply_row], index.reply_texts[reply_row], score, "query_similarity")
        )
    return _distinct(hits, k, exclude)


def reply_matching(
    serving: Serving,
    context_vector: np.ndarray,
    k: int,
    exclude: set[str],
    poly_vectors: np.ndarray | None = None,
    rerank_depth: int = 50,
) -> list[Scored]:
    """Stored replies scored directly against the whole context.

    context_vector: [D]. With poly_vectors ([m, D]) the FAISS top
    `rerank_depth` are rescored by the poly head before the top k are taken.
    """
    index = serving.index
    depth = max(k, rerank_depth) if poly_vectors is not None else k
    scores, rows = _search(index.reply_index, context_vector, depth + len(exclude))
    if poly_vectors is not None and len(rows):
        if serving.reranker is None:
            raise ValueError("poly vectors given but the bundle has no poly head")
        replies = np.asarray(index.reply_vectors[rows])  # [K, D]
        scores = serving.reranker.rescore(poly_vectors, scores, replies)  # [K]
        order = np.argsort(-scores, kind="stable")
        scores, rows = scores[order], rows[order]
    hits = [
        Scored(row, index.reply_ids[row], index.reply_texts[row], score, "reply_matching")
        for score, row in zip(scores.tolist(), rows.tolist(), strict=True)
    ]
    return _distinct(hits, k, exclude)


def reaction(serving: Serving, context_vector: np.ndarray, k: int, exclude: set[str]) -> list[Scored]:
    """The reaction classes likeliest after this context; score is the class probability."""
    if serving.reactions is None:
        return []
    classifier = serving.reactions
    hits = [
        Scored(-1, f"reaction:{c}", classifier.labels[c], p, "reaction")
        for c, p in classifier.top(context_vector, k + len(exclude))
    ]
    return [h for h in hits if normalize(h.text) not in exclude][:k]


@dataclass(frozen=True)
class Answer:
    best: Scored
    candidates: list[Scored]


def search_queries(serving: Serving, vector: np.ndarray, k: int) -> tuple[list[float], list[int]]:
    """The k stored queries nearest to vector [D]: (scores, query rows)."""
    scores, rows = _search(serving.index.query_index, vector, k)
    return scores.tolist(), rows.tolist()
