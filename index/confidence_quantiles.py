"""Where the reaction share's threshold starts on a new candidate set.

The bundle's confidence quantiles were fitted on validation turns against the
candidate set it was calibrated with. On another set the scores shift, and the
same threshold hands another share of turns to reactions: with the release,
26% of chitchat validation turns against that split's own replies, and 49% of
our Korean dev turns against theirs (`python -m bench.reaction_share`). The
service moves to the share of its own recent turns once a few are in
(`core.confidence.ShareThreshold`); until then, a fresh upload's first users
got reactions two to five times as often as the setting asks.

So each index version carries the confidence its own stored replies get when
each is said as a one-turn context. The service blocks a reply that repeats the
user's words, so the reply itself (and any echo of it) drops out, as it would
for a user who said it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import faiss
import numpy as np

from core import confidence
from core.confidence import ConfidenceModel
from core.encoder import Encoder
from core.retriever import OVERFETCH, Avoid, Scored, distinct, in_script
from core.text import script_of

# Stored replies said as contexts: at a 10% share, one binomial standard error of 500
# draws is 1.3 points of share.
SAMPLE = 500


def sampled(reply_texts: Sequence[str], seed: int = 0) -> list[str]:
    """The stored replies `stored_reply_confidences` says as contexts."""
    rows = np.random.default_rng(seed).choice(len(reply_texts), size=min(len(reply_texts), SAMPLE), replace=False)
    return [reply_texts[r] for r in rows]


def stored_reply_confidences(
    reply_index: faiss.Index,
    reply_texts: Sequence[str],
    encoder: Encoder,
    context_vectors: Callable[[list[str]], np.ndarray] | None = None,
    seed: int = 0,
) -> np.ndarray:
    """[S] the bundle's reply-matching confidence for a sample of stored replies, each as a
    one-turn context; empty when the bundle has no confidence model. context_vectors: texts -> [S, D]
    their context vectors, where a build already has them; None encodes them (a one-turn
    context is the turn itself)."""
    spec = encoder.manifest.confidence
    if spec is None or not reply_texts:
        return np.empty(0)
    model = ConfidenceModel(spec)
    texts = sampled(reply_texts, seed)
    vectors = context_vectors(texts) if context_vectors else encoder.encode(texts, "context")  # [S, D]
    turns = [[text] for text in texts]
    if encoder.combiner is not None:  # a one-turn context's vector, per turn: its turn's, combined
        padded = np.zeros((len(texts), encoder.combiner.turns, vectors.shape[1]), dtype=np.float32)  # [S, N, D]
        padded[:, 0] = vectors
        vectors = encoder.combiner.combine_many(padded, turns)  # [S, D]
    # As deep as the service searches for a one-turn context: DEPTH hits, past the echo and a few repeats.
    scores, found = reply_index.search(vectors, confidence.DEPTH + 1 + OVERFETCH)  # [S, K] each
    values = []
    for said, row_scores, row_found in zip(turns, scores.tolist(), found.tolist(), strict=True):
        hits = [
            Scored(r, "", reply_texts[r], s, "reply_matching")
            for s, r in zip(row_scores, row_found, strict=True)
            if r >= 0
        ]
        hits = distinct(in_script(hits, script_of(said)), confidence.DEPTH, Avoid.of(said))
        if hits:
            values.append(model(confidence.features([h.score for h in hits], said, hits[0].text)))
    return np.array(values)  # [S]


def quantiles(values: np.ndarray) -> list[float]:
    """[101] the 0th to 100th percentile, the shape of `ConfidenceSpec.quantiles`; [] for no values."""
    if not len(values):
        return []
    return [round(float(q), 6) for q in np.quantile(values, np.linspace(0, 1, 101))]
