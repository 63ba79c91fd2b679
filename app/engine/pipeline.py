"""The request flows: sessions and cache around the CPU work in `retriever`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.engine import retriever
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


@dataclass(frozen=True)
class ReplyOutcome:
    answer: Answer
    index_version: str


async def reply(
    runtime: Runtime,
    turns: Sequence[str],
    k: int,
    strategies: Sequence[Strategy],
    exclude: set[str],
) -> ReplyOutcome:
    """Walks the strategies in the fixed order; the first whose top score
    clears its threshold answers. If none does, the last one that found
    anything answers anyway: a low-confidence reply beats no reply until a
    reaction fallback exists.

    Each strategy encodes only what it needs, when it is reached: a turn that
    query similarity answers never pays for encoding the whole context.
    """
    serving = runtime.current()  # this request's snapshot, start to end
    thresholds = serving.bundle.thresholds
    tried: list[retriever.Scored] = []
    for strategy in (s for s in retriever.STRATEGY_ORDER if s in strategies):
        if strategy == "query_similarity":
            vector = (await embed(runtime, serving, [turns[-1]], "context"))[0]  # [D]
            hits = await runtime.pool.run(retriever.query_similarity, serving, vector, k, exclude)
            threshold = thresholds.query_similarity
        else:
            context = serving.encoder.join_context(turns)
            vector = (await embed(runtime, serving, [context], "context"))[0]  # [D]
            hits = await runtime.pool.run(retriever.reply_matching, serving, vector, k, exclude)
            threshold = thresholds.reply_matching
        if hits:
            tried = hits
            if hits[0].score >= threshold:
                break
    if not tried:
        raise NoCandidates("every candidate was excluded")
    return ReplyOutcome(Answer(tried[0], tried), serving.index_version)


async def session_reply(
    runtime: Runtime, session_id: str, message: str, k: int, strategies: Sequence[Strategy]
) -> ReplyOutcome:
    """Context from the session store; the bot's own recent replies are excluded."""
    history = await runtime.sessions.history(session_id)
    no_repeat = runtime.settings.session_no_repeat
    recent_bot = [t.text for t in history if t.role == "bot"][-no_repeat:] if no_repeat else []
    turns = [t.text for t in history] + [message]
    outcome = await reply(runtime, turns, k, strategies, {normalize(t) for t in recent_bot})
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
