"""The request flows: sessions, the embedding cache and the encoder queue
around the CPU work in `retriever`."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from app.engine.encoding import EncodeJob
from app.engine.runtime import QUERY_SIMILARITY_OFF, Runtime
from app.engine.sessions import SessionTurn, TurnVector, space_of
from app.engine.sets import DEFAULT_SET
from core import retriever
from core.bundle import BundleManifest, Thresholds
from core.encoder import Encoder, Side
from core.filters import Filter
from core.laps import Laps
from core.retriever import Answer, Serving, Strategy
from core.text import normalize

log = logging.getLogger(__name__)


class NoCandidates(Exception):
    """No candidate may answer: every one is excluded, or the request's filter admits none."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class Unsupported(Exception):
    """The request asks for something the serving bundle lacks."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class Encodes(Protocol):
    """What `embed` needs of a model: a set's serving snapshot, or a model with no index."""

    @property
    def bundle(self) -> BundleManifest: ...

    @property
    def encoder(self) -> Encoder: ...


async def embed(
    runtime: Runtime,
    serving: Encodes,
    texts: Sequence[str],
    poly_for: str | None = None,
    sides: Sequence[Side] | None = None,
) -> tuple[list[np.ndarray], np.ndarray | None]:
    """[D] vectors of `texts`, each on its side (context unless `sides` says otherwise), and, for
    the context `poly_for`, its [m, D] poly vectors.

    From the cache where it can (at most one Redis round trip); the misses go to the
    encoder queue as one job, so they cost one encoder pass together."""
    checksum, dim, lowercase = serving.bundle.checksum, serving.encoder.dim, serving.encoder.lowercases
    every: Sequence[Side] = sides or ["context"] * len(texts)
    items: list[tuple[str, Side]] = list(zip(texts, every, strict=True))
    distinct = list(dict.fromkeys(items))
    keys = [runtime.cache.key(checksum, side, t, lowercase) for t, side in distinct]  # normalised, hashed once
    m = serving.bundle.poly.codes if serving.bundle.poly is not None else 0
    stages, started = runtime.stages, time.perf_counter()
    vectors = dict(zip(distinct, await runtime.cache.get_many(keys, dim), strict=True))
    poly, poly_key = None, ""
    if poly_for is not None:  # kept in this process only (below): no Redis key to look for
        poly_key = runtime.cache.key(checksum, "poly", poly_for, lowercase)
        found = (await runtime.cache.get_many([poly_key], m * dim, shared=False))[0]
        poly = found.reshape(m, dim) if found is not None else None
    stages.observe("cache_read", time.perf_counter() - started)
    missing = [item for item in distinct if vectors[item] is None]
    if poly_for is not None and poly is None and (poly_for, "context") not in missing:
        missing.append((poly_for, "context"))  # cached vector, evicted poly vectors: encode it again
    if missing:
        started = time.perf_counter()
        ids_of: dict[tuple[str, Side], list[int]] = {}
        for side in dict.fromkeys(side for _, side in missing):
            these = [item for item in missing if item[1] == side]
            ids_of.update(zip(these, serving.encoder.tokenize([t for t, _ in these], side), strict=True))
        ids = [ids_of[item] for item in missing]
        stages.observe("tokenize", time.perf_counter() - started)
        job = EncodeJob(serving.encoder, ids, poly=poly_for is not None, sides=[side for _, side in missing])
        encoded = await runtime.encoder_queue.submit(job, job.tokens)
        fresh: dict[str, np.ndarray] = {}
        fresh_poly: dict[str, np.ndarray] = {}
        key_of = dict(zip(distinct, keys, strict=True))
        for i, item in enumerate(missing):
            # `poly_for` is one of `texts` as `reply` calls this; a caller's other text gets its key here.
            key = key_of.get(item) or runtime.cache.key(checksum, item[1], item[0], lowercase)
            vectors[item] = fresh[key] = encoded.vectors[i]
            if item == (poly_for, "context") and encoded.poly is not None:
                poly = encoded.poly[i]
                fresh_poly[poly_key] = poly.reshape(-1)
        started = time.perf_counter()
        await runtime.cache.put_many(fresh)
        # Poly vectors are m times a context vector's size (24 kB at m = 16) and belong to one
        # joined context, which a session's next turn never repeats: the process keeps them.
        await runtime.cache.put_many(fresh_poly, share=False)
        stages.observe("cache_write", time.perf_counter() - started)
    out = [vectors[item] for item in items]
    assert all(v is not None for v in out)  # every miss was just encoded
    return [v for v in out if v is not None], poly


@dataclass(frozen=True)
class ReplyOptions:
    k: int
    strategies: Sequence[Strategy]
    # Settled by the route (the request's, else Settings.rerank_by_default); only where the bundle has a poly head.
    rerank: bool = False
    thresholds: dict[str, float] | None = None  # per-request overrides of the bundle's thresholds
    rerank_depth: int = 50  # FAISS hits the poly head rescores
    rule: Filter | None = None  # which candidates may answer: tags, language, ids
    set_name: str = DEFAULT_SET  # the candidate set to answer from
    route_language: bool = True  # answer from the conversation's language's replies (`retriever.answer_language`)


@dataclass(frozen=True)
class ReplyOutcome:
    answer: Answer
    index_version: str
    # In the per-turn way, what a session keeps with the turns: the last turn's vector, and the
    # answer's where the index has it (a stored reply read on the side the bot's turns are).
    message_vector: TurnVector | None = None
    answer_vector: TurnVector | None = None


def _thresholds(bundle: Thresholds, overrides: dict[str, float] | None) -> Thresholds:
    return replace(bundle, **overrides) if overrides else bundle


async def reply(
    runtime: Runtime,
    turns: Sequence[str],
    options: ReplyOptions,
    exclude: set[str],
    history: Sequence[SessionTurn] = (),
) -> ReplyOutcome:
    """The walk of `retriever.walk` over one snapshot, with one encoder pass for
    the vectors it needs. No answer is ever a near copy of a turn of the
    conversation, or a reply in `exclude` (normalised texts). `history`: the
    session's stored turns, `turns` less its last, whose vectors in this
    snapshot's space need no encoding."""
    serving = runtime.current(options.set_name)  # this request's snapshot, start to end
    allowed = options.strategies
    window = list(turns[-serving.bundle.max_context_turns :])  # what echoes and confidence are judged by
    script = retriever.conversation_script(window)  # once a request: the reactions and the walk read it
    # A bundle without a poly head answers unreranked, and the answer's `reranked` says so: a client
    # that always asks keeps working across bundles (the release has none; /info shows `poly`).
    rerank = options.rerank and serving.reranker is not None
    if list(allowed) == ["reaction"] and not serving.reactions_apply(script, options.rule):
        if not serving.reaction_sets():
            raise Unsupported("strategies", "this bundle has no reaction set, and none was uploaded")
        if not serving.reactions_apply(script):
            # A valid request that no stored reaction can answer, as with a filter that admits none: a
            # multilingual bundle assumes no language for a window without letters ("0", "😂").
            raise NoCandidates(
                "no reaction set (the model's, or uploaded) speaks this conversation's language", "strategies"
            )
        raise NoCandidates("no reaction in this conversation's language matches the filter and exclude_ids", "filter")
    wants_query = _wants_query(runtime, serving, turns[-1], options)
    wants_context = "reply_matching" in allowed or "reaction" in allowed
    with_poly = rerank and "reply_matching" in allowed  # reactions need no poly vectors
    joined = serving.encoder.join_context(turns)
    # The last turn is compared with stored queries, so it is encoded as they were.
    query_side: Side = serving.index.manifest.query_side
    texts = [turns[-1]] if wants_query else []
    sides: list[Side] = [query_side] if wants_query else []
    combiner = serving.combiner if wants_context else None
    recent = combiner.window(turns) if combiner is not None else []
    recent_sides = combiner.sides(len(recent)) if combiner is not None else []
    kept = _kept_vectors(serving, turns, recent_sides, history) if combiner is not None else {}
    if combiner is not None:  # each turn alone, on its side; a kept one is not encoded again
        missing = [i for i in range(len(recent)) if i not in kept]
        texts += [recent[i] for i in missing]
        sides += [recent_sides[i] for i in missing]
    elif wants_context:
        texts.append(joined)
        sides.append("context")
    vectors, poly = await embed(runtime, serving, texts, joined if with_poly else None, sides)
    query_vector = vectors[0] if wants_query else None
    context_vector = turn_vector = None
    message = answer_vector = None
    if combiner is not None:
        found = iter(vectors[1:] if wants_query else vectors)
        turn_vectors = [kept[i] if i in kept else next(found) for i in range(len(recent))]  # T x [D], oldest first
        context_vector = combiner.combine(np.stack(turn_vectors), recent)  # [D]
        turn_vector = turn_vectors[-1]
        message = TurnVector(turn_vector, space_of(serving.bundle.checksum, recent_sides[-1]))
    elif wants_context:
        context_vector = vectors[-1]
    laps = Laps()  # the walk's searches, rerank and reactions, timed in the pool's thread
    request = retriever.WalkRequest(
        window=window,
        allowed=allowed,
        k=options.k,
        thresholds=_thresholds(serving.thresholds, options.thresholds),
        avoid=retriever.Avoid.of(window, exclude),
        query_vector=query_vector,
        context_vector=context_vector,
        poly_vectors=poly,
        script=script,
        rerank_depth=options.rerank_depth,
        threshold_given=bool(options.thresholds and "reply_matching" in options.thresholds),
        laps=laps,
        rule=options.rule,
        route_language=options.route_language,
        turn_vector=turn_vector,
    )
    answer = await runtime.pool.run(retriever.walk, serving, request)
    runtime.stages.observe_all(laps.seconds)
    if answer is None:
        if options.rule:
            raise NoCandidates("no candidate matches the filter and exclude_ids, or every match was excluded", "filter")
        raise NoCandidates("every candidate was excluded")
    if combiner is not None:
        answer_vector = await _answer_vector(runtime, serving, answer)
    return ReplyOutcome(answer, serving.index_version, message, answer_vector)


def _kept_vectors(
    serving: Serving, turns: Sequence[str], sides: Sequence[Side], history: Sequence[SessionTurn]
) -> dict[int, np.ndarray]:
    """Position in the combiner's window -> the stored vector of that turn, where the session kept
    one in this snapshot's space (the same bundle, the same side). `history` is `turns` less the
    newest, so the newest turn never has one."""
    first = len(turns) - len(sides)  # the window's first turn, as an index of `turns`
    kept = {}
    for i, side in enumerate(sides):
        at = first + i
        if at < len(history) and history[at].text == turns[at]:
            vector = history[at].vector_in(space_of(serving.bundle.checksum, side))
            if vector is not None and vector.shape == (serving.encoder.dim,):  # a torn record is encoded again
                kept[i] = vector
    return kept


async def _answer_vector(runtime: Runtime, serving: Serving, answer: Answer) -> TurnVector | None:
    """The answer's vector on the side the bot's turns are read, where the index holds it (a stored
    reply, not a reaction): kept with the session's turn, and in the cache for a caller that sends
    the turns itself. No encoder pass: the index has it."""
    combiner = serving.combiner
    row = answer.best.reply_row
    if combiner is None or combiner.turns < 2 or not combiner.reply_side[1] or row < 0:
        return None
    stored = serving.index.reply_vectors(np.array([row], dtype=np.int64))[0]  # [D], as the codes hold it
    vector = stored / max(float(np.linalg.norm(stored)), 1e-12)
    checksum = serving.bundle.checksum
    key = runtime.cache.key(checksum, "reply", answer.best.text, serving.encoder.lowercases)
    await runtime.cache.put_many({key: vector})
    return TurnVector(vector, space_of(checksum, "reply"))


def _wants_query(runtime: Runtime, serving: Serving, last_turn: str, options: ReplyOptions) -> bool:
    """Whether the last turn is encoded for query similarity.

    At the bundle's threshold query similarity answers on a near copy of a stored query, in
    practice an exact one (Settings.query_similarity_exact_only), so without one the last turn
    is not encoded. At QUERY_SIMILARITY_OFF, above the 1.0 of an exact copy, it never answers:
    calibration sets that where it was worth nothing (the release). A request's own threshold,
    or no reply matching to fall to, needs the vector."""
    allowed = options.strategies
    if "query_similarity" not in allowed:
        return False
    if "reply_matching" not in allowed or "query_similarity" in (options.thresholds or {}):
        return True
    if serving.thresholds.query_similarity >= QUERY_SIMILARITY_OFF:
        return False
    return not runtime.settings.query_similarity_exact_only or normalize(last_turn) in serving.index.query_rows_by_text


# A turn that lost the race to store SESSION_ATTEMPTS times (turns of one session arriving
# together at different replicas) is answered without being stored.
SESSION_ATTEMPTS = 4


async def session_reply(
    runtime: Runtime,
    session_id: str,
    message: str,
    options: ReplyOptions,
    still_wanted: Callable[[], Awaitable[bool]] | None = None,
) -> ReplyOutcome:
    """Context from the session store; the bot's own recent replies are excluded.

    The turn is stored only if `still_wanted()` says the caller is still there
    to receive the reply: a reply nobody saw must not become context. A named
    set's sessions are its own: one id sent to two bots is two conversations."""
    if options.set_name != DEFAULT_SET:
        session_id = f"{options.set_name}/{session_id}"  # "/" is in no session id, so in no default-set key
    async with runtime.sessions.turn(session_id):
        for _ in range(SESSION_ATTEMPTS):
            started = time.perf_counter()
            history = await runtime.sessions.history(session_id)
            runtime.stages.observe("session_read", time.perf_counter() - started)
            no_repeat = runtime.settings.session_no_repeat
            recent_bot = [t.text for t in history.turns if t.role == "bot"][-no_repeat:] if no_repeat else []
            turns = [t.text for t in history.turns] + [message]
            outcome = await reply(runtime, turns, options, {normalize(t) for t in recent_bot}, history.turns)
            if still_wanted is not None and not await still_wanted():
                return outcome
            user = SessionTurn("user", message, outcome.message_vector)
            bot = SessionTurn("bot", outcome.answer.best.text, outcome.answer_vector)
            started = time.perf_counter()
            stored = await runtime.sessions.append(session_id, history, user, bot)
            runtime.stages.observe("session_write", time.perf_counter() - started)
            if stored:
                return outcome
            # Another replica stored a turn of this session meanwhile: answer again, from it.
        log.warning("session turn answered but not stored: %d other turns came first", SESSION_ATTEMPTS)
    return outcome


async def similar_queries(
    runtime: Runtime, text: str, k: int, set_name: str = DEFAULT_SET
) -> tuple[list[tuple[str, str, float]], str]:
    serving = runtime.current(set_name)
    index = serving.index
    vector = (await embed(runtime, serving, [text], sides=[index.manifest.query_side]))[0][0]  # [D]
    scores, rows = await runtime.pool.run(retriever.search_queries, serving, vector, k)
    matches = [
        (index.query_texts[r], index.reply_texts[int(index.query_reply_rows[r])], round(s, 6))
        for s, r in zip(scores, rows, strict=True)
    ]
    return matches, serving.index_version


async def pair_scores(
    runtime: Runtime, pairs: Sequence[tuple[str, str]], set_name: str = DEFAULT_SET
) -> tuple[list[float], str | None]:
    """A cosine per pair, with the set's encoder; scoring needs no index, so a set that serves
    nothing yet scores with the default encoder, and no index version is named."""
    serving = runtime.candidate_set(set_name).serving
    model: Encodes = serving if serving is not None else runtime.current_model()
    vectors, _ = await embed(runtime, model, [t for pair in pairs for t in pair])
    stacked = np.stack(vectors)  # [2P, D]
    a, b = stacked[0::2], stacked[1::2]  # [P, D] each
    return [round(float(s), 6) for s in (a * b).sum(axis=1)], serving.index_version if serving else None
