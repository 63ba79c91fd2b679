"""The request flows: sessions and cache around the CPU work in `retriever`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from app.engine import retriever
from app.engine.bundle import Thresholds
from app.engine.encoder import Side
from app.engine.retriever import Answer, Serving, Strategy
from app.engine.runtime import Runtime
from app.engine.sessions import SessionTurn
from app.engine.text import normalize


class NoCandidates(Exception):
    pass


async def embed(runtime: Runtime, serving: Serving, texts: Sequence[str], side: Side) -> np.ndarray:
    """[N, D] vectors, from the cache where possible; misses in one encoder batch."""
    checksum = serving.bundle.checksum
    keys = [runtime.cache.key(checksum, side, t) for t in texts]
    found = await runtime.cache.get_many(keys, serving.encoder.dim)
    missing = [i for i, v in enumerate(found) if v is None]
    if missing:
        fresh = await runtime.pool.run(serving.encoder.encode, [texts[i] for i in missing], side)  # [M, D]
        await runtime.cache.put_many({keys[i]: fresh[j] for j, i in enumerate(missing)})
        for j, i in enumerate(missing):
            found[i] = fresh[j]
    return np.stack([v for v in found if v is not None])  # [N, D]


async def embed_context(
    runtime: Runtime, serving: Serving, text: str, with_poly: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """A context's [D] vector and, with_poly, its [m, D] poly vectors; cached like `embed`."""
    if not with_poly or serving.bundle.poly is None:
        return (await embed(runtime, serving, [text], "context"))[0], None
    m, dim = serving.bundle.poly.codes, serving.encoder.dim
    context_key = runtime.cache.key(serving.bundle.checksum, "context", text)
    poly_key = runtime.cache.key(serving.bundle.checksum, "poly", text)
    vector, poly = await runtime.cache.get_many([context_key, poly_key], [dim, m * dim])  # one round trip
    if vector is not None and poly is not None:
        return vector, poly.reshape(m, dim)
    vectors, polys = await runtime.pool.run(serving.encoder.encode_with_poly, [text])  # [1, D], [1, m, D]
    await runtime.cache.put_many({context_key: vectors[0], poly_key: polys[0].reshape(-1)})
    return vectors[0], polys[0]


class Unsupported(Exception):
    """The request asks for something the serving bundle lacks."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class ReplyOptions:
    k: int
    strategies: Sequence[Strategy]
    rerank: bool | None = None  # None: rerank when the bundle has a poly head
    thresholds: dict[str, float] | None = None  # per-request overrides of the bundle's thresholds
    rerank_depth: int = 50  # FAISS hits the poly head rescores


@dataclass(frozen=True)
class ReplyOutcome:
    answer: Answer
    index_version: str
    reranked: bool


def _thresholds(bundle: Thresholds, overrides: dict[str, float] | None) -> Thresholds:
    return replace(bundle, **overrides) if overrides else bundle


async def reply(runtime: Runtime, turns: Sequence[str], options: ReplyOptions, exclude: set[str]) -> ReplyOutcome:
    """Walks the strategies in the fixed order; the first whose top score
    clears its threshold answers, and a reaction always clears. If none
    does, the last one that found anything answers anyway: a low-confidence
    reply beats no reply.

    Each strategy encodes only what it needs, when it is reached: a turn that
    query similarity answers never pays for encoding the whole context.
    """
    serving = runtime.current()  # this request's snapshot, start to end
    rerank = serving.reranker is not None if options.rerank is None else options.rerank
    if rerank and serving.reranker is None:
        raise Unsupported("rerank", f"bundle {serving.bundle.name} has no poly head to rerank with")
    if list(options.strategies) == ["reaction"] and serving.reactions is None:
        raise Unsupported("strategies", f"bundle {serving.bundle.name} has no reaction classifier")
    thresholds = _thresholds(serving.bundle.thresholds, options.thresholds)
    context: tuple[np.ndarray, np.ndarray | None] | None = None  # encoded once, when first needed
    tried: list[retriever.Scored] = []
    for strategy in (s for s in retriever.STRATEGY_ORDER if s in options.strategies):
        if strategy == "query_similarity":
            vector = (await embed(runtime, serving, [turns[-1]], "context"))[0]  # [D]
            hits = await runtime.pool.run(retriever.query_similarity, serving, vector, options.k, exclude)
            threshold = thresholds.query_similarity
        else:
            if context is None:
                with_poly = rerank and "reply_matching" in options.strategies  # reactions need no poly vectors
                context = await embed_context(runtime, serving, serving.encoder.join_context(turns), with_poly)
            vector, poly = context  # [D], [m, D] or None
            if strategy == "reply_matching":
                hits = await runtime.pool.run(
                    retriever.reply_matching, serving, vector, options.k, exclude, poly, options.rerank_depth
                )
                threshold = thresholds.reply_matching
            else:
                hits = await runtime.pool.run(retriever.reaction, serving, vector, options.k, exclude)
                threshold = float("-inf")  # the last resort takes whatever reaches it
        if hits:
            tried = hits
            if hits[0].score >= threshold:
                break
    if not tried:
        raise NoCandidates("every candidate was excluded")
    reranked = rerank and tried[0].source == "reply_matching"
    return ReplyOutcome(Answer(tried[0], tried), serving.index_version, reranked)


async def session_reply(runtime: Runtime, session_id: str, message: str, options: ReplyOptions) -> ReplyOutcome:
    """Context from the session store; the bot's own recent replies are excluded."""
    history = await runtime.sessions.history(session_id)
    no_repeat = runtime.settings.session_no_repeat
    recent_bot = [t.text for t in history if t.role == "bot"][-no_repeat:] if no_repeat else []
    turns = [t.text for t in history] + [message]
    outcome = await reply(runtime, turns, options, {normalize(t) for t in recent_bot})
    await runtime.sessions.append(
        session_id, SessionTurn("user", message), SessionTurn("bot", outcome.answer.best.text)
    )
    return outcome


async def similar_queries(runtime: Runtime, text: str, k: int) -> tuple[list[tuple[str, str, float]], str]:
    serving = runtime.current()
    vector = (await embed(runtime, serving, [text], "context"))[0]  # [D]
    index = serving.index
    scores, rows = await runtime.pool.run(retriever.search_queries, serving, vector, k)
    matches = [
        (index.query_texts[r], index.reply_texts[int(index.query_reply_rows[r])], round(s, 6))
        for s, r in zip(scores, rows, strict=True)
    ]
    return matches, serving.index_version


async def pair_scores(runtime: Runtime, pairs: Sequence[tuple[str, str]]) -> tuple[list[float], str]:
    serving = runtime.current()
    vectors = await embed(runtime, serving, [t for pair in pairs for t in pair], "context")  # [2P, D]
    a, b = vectors[0::2], vectors[1::2]  # [P, D] each
    return [round(float(s), 6) for s in (a * b).sum(axis=1)], serving.index_version
