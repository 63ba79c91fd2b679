"""The request flows: sessions and cache around the CPU work in `retriever`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.engine import retriever
from app.engine.encoder import Side
from app.engine.retriever import Answer, Serving
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
    strategies: Sequence[str],
    exclude: set[str],
) -> ReplyOutcome:
    serving = runtime.current()  # this request's snapshot, start to end
    query_text = turns[-1]
    context_text = serving.encoder.join_context(turns)
    texts = [query_text] if context_text == query_text else [query_text, context_text]
    vectors = await embed(runtime, serving, texts, "context")  # [1 or 2, D]
    query_vector, context_vector = vectors[0], vectors[-1]
    answer = await runtime.pool.run(retriever.answer, serving, query_vector, context_vector, k, strategies, exclude)
    if answer is None:
        raise NoCandidates("every candidate was excluded")
    return ReplyOutcome(answer, serving.index_version)


async def session_reply(
    runtime: Runtime, session_id: str, message: str, k: int, strategies: Sequence[str]
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
