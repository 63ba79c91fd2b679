"""The retrieval strategies over one (bundle, index version) snapshot.

Pure CPU code with no I/O: the caller runs it off the event loop. The service
runs it per request; `models/walk.py` replays it on held-out turns to calibrate
and evaluate what is served.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np

from core import filters
from core.bundle import BundleManifest, Thresholds
from core.confidence import DEPTH, ConfidenceModel, ShareThreshold
from core.confidence import features as confidence_features
from core.context import Combiner
from core.encoder import Encoder
from core.filters import Admitted, Filter, Side, admitted
from core.laps import Laps, lap
from core.mood import MoodGuard, TurnReading
from core.reactions import ReactionClassifier
from core.reranker import PolyReranker
from core.store import IndexVersion
from core.text import SCRIPT_OF_LANGUAGE, Signature, echoes, normalize, script_of

Strategy = Literal["query_similarity", "reply_matching", "reaction"]

# Quality falls and coverage rises along this order (docs/architecture.md, "How it answers").
STRATEGY_ORDER: tuple[Strategy, ...] = ("query_similarity", "reply_matching", "reaction")


@dataclass(frozen=True)
class Serving:
    """What one request uses from start to end; swapped as a whole."""

    bundle: BundleManifest
    bundle_dir: Path
    encoder: Encoder
    index: IndexVersion
    # The bundle's thresholds, the reply-matching one set from the configured reaction share.
    thresholds: Thresholds
    reranker: PolyReranker | None = None  # the bundle's poly head, if it has one
    # The reaction model's classifier where the service has one, else the bundle's own, if it has one.
    reactions: ReactionClassifier | None = None
    confidence: ConfidenceModel | None = None  # the bundle's confidence model, if it has one
    # The reply-matching threshold that keeps the configured share of recent turns for reactions.
    share: ShareThreshold | None = None
    # The per-turn way's combiner (core/context.py): each turn encoded alone, the context vector
    # combined from theirs. None: the joined way, the window encoded as one text.
    combiner: Combiner | None = None

    @property
    def index_version(self) -> str:
        return self.index.version

    def reaction_script(self, script: str | None) -> str | None:
        """The script a reaction must be written in, None for no reaction, given the conversation's
        script (`conversation_script`, worked out once a request), so "😂" after a Korean line is
        still Korean. A window with no letters at all (emoji, "?!") gets the script of the bundle's
        language: Latin for an English bundle, none for a multilingual one, which has no language
        to assume."""
        return script or SCRIPT_OF_LANGUAGE.get(self.bundle.language)

    def uploaded_reactions(self, script: str | None, rule: Filter | None = None) -> np.ndarray:
        """[X'] rows of the index version's uploaded reactions written in the script of a conversation
        written in `script` (and admitted by `rule`)."""
        index = self.index
        script = self.reaction_script(script)
        if index.reaction_vectors is None or script is None:
            return np.empty(0, dtype=np.int64)
        rows = []
        for i, language in enumerate(index.reaction_languages):
            if SCRIPT_OF_LANGUAGE.get(language) != script:
                continue
            if rule and not rule.admits(index.reaction_ids[i], index.reaction_tags[i], language):
                continue
            rows.append(i)
        return np.array(rows, dtype=np.int64)

    def classifier_language(self, script: str | None, rule: Filter | None = None) -> str | None:
        """The language of the bundle's reactions that a conversation written in `script` is written in
        (its script, at least). None also when `rule` asks for tags (the model's reactions carry none)
        or another language."""
        if self.reactions is None or (rule and rule.selects_tags):
            return None
        script = self.reaction_script(script)
        if script is None:
            return None
        language = next((lang for lang in self.reactions.languages if SCRIPT_OF_LANGUAGE.get(lang) == script), None)
        if rule and rule.language is not None and language != rule.language:
            return None
        return language

    def reactions_apply(self, script: str | None, rule: Filter | None = None) -> bool:
        """Whether some reaction set fits a conversation written in `script`: no English reaction in a
        Korean conversation."""
        return len(self.uploaded_reactions(script, rule)) > 0 or self.classifier_language(script, rule) is not None

    def reaction_sets(self) -> list[ReactionSet]:
        """Every reaction set this snapshot can answer from: the model's, then those uploaded, by language."""
        model = self.reactions.languages if self.reactions else []
        sets = [ReactionSet("model", language, len(self.reactions.labels)) for language in model if self.reactions]
        uploaded = Counter(self.index.reaction_languages) if self.index.reaction_vectors is not None else Counter()
        return sets + [ReactionSet("upload", language, n) for language, n in sorted(uploaded.items())]


def conversation_script(turns: Sequence[str]) -> str | None:
    """The script a reply to these turns is written in: the last turn's, the one being answered, so a
    user who turns from Korean to English is answered in English; where it has no letters ("😂",
    "?!"), the one most letters of the whole window are in. None without letters."""
    return (script_of([turns[-1]]) or script_of(list(turns))) if turns else None


@dataclass(frozen=True)
class ReactionSet:
    source: Literal["model", "upload"]
    language: str  # BCP 47
    count: int  # reactions in the set


@dataclass(frozen=True)
class Scored:
    reply_row: int  # -1 for a reaction, which is not an index row
    id: str
    text: str
    score: float
    source: Strategy


def _search(
    version: IndexVersion, side: Side, vector: np.ndarray, k: int, only: Admitted | None = None, narrow: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    # vector: [D] -> scores [k], rows [k] of the side's index, among the rows `only` admits
    scores, rows = filters.search(version, side, vector[None, :], k, only, narrow)
    keep = rows[0] >= 0
    return scores[0][keep], rows[0][keep]


@dataclass(frozen=True)
class Avoid:
    """What no candidate may be: a reply excluded by its normalised text (the
    bot's recent replies in a session) or by its id (a request's `exclude_ids`),
    or a near copy of a turn of the conversation (the user's own words said
    back), or a stored reply whose mood is the opposite of the turn's clear one
    (`mood`: cheer to bad news). Dropped after the search, which fetches
    `len(avoid)` hits deeper."""

    texts: frozenset[str] = frozenset()
    turns: tuple[Signature, ...] = ()
    ids: frozenset[str] = frozenset()
    mood: MoodGuard | None = None

    @classmethod
    def of(cls, turns: list[str], excluded: set[str] | None = None, ids: frozenset[str] = frozenset()) -> Avoid:
        return cls(frozenset(excluded or ()), tuple(Signature.of(t) for t in turns), ids)

    def __len__(self) -> int:
        return len(self.texts) + len(self.turns) + len(self.ids)

    def blocks(self, text: str, id: str = "", row: int = -1) -> bool:
        """row: the hit's stored reply row, which `mood` reads; -1 for a reaction. The mood is asked
        last: it may read the turn (an encoder pass), which a hit blocked anyway need not cost."""
        if id in self.ids:
            return True
        normalized = normalize(text)
        if normalized in self.texts or echoes(normalized, self.turns, normalized=True):
            return True
        return self.mood is not None and row >= 0 and self.mood.blocks(row)


def distinct(hits: list[Scored], k: int, avoid: Avoid) -> list[Scored]:
    """First hit per reply, skipping what `avoid` blocks."""
    seen: set[int] = set()
    out = []
    for hit in hits:
        if hit.reply_row in seen or avoid.blocks(hit.text, hit.id, hit.reply_row):
            continue
        seen.add(hit.reply_row)
        out.append(hit)
        if len(out) == k:
            break
    return out


def answer_language(index: IndexVersion, script: str | None, rule: Filter | None = None) -> str | None:
    """The language a conversation written in `script` is answered in: the one language of the version's
    replies written in that script, where every reply carries a language whose script is known (the
    default set: chitchat's English and the shipped Korean). None where a request's filter names a
    language of its own, or where no single language fits: then every candidate competes, and the hits
    in the conversation's script are kept (`in_script`).

    A multilingual encoder puts a Korean turn near its English translation, and an English reply set 20
    times the Korean one's size holds many such near translations: searching the language's rows alone
    (a filter on the language, compiled once a version) keeps them out of the top k."""
    if script is None or (rule is not None and rule.language is not None):
        return None
    languages = _LANGUAGES_BY_VERSION.get(index.version)
    if languages is None:  # once a version: a pass over its language rows
        languages = _languages_by_script(index)
        if len(_LANGUAGES_BY_VERSION) >= _VERSIONS_KEPT:
            _LANGUAGES_BY_VERSION.clear()
        _LANGUAGES_BY_VERSION[index.version] = languages
    fits = languages.get(script, ())
    return fits[0] if len(fits) == 1 else None


# A version never changes once committed, so its name keys what its rows say. Kept here, not in the
# version's own memo, whose order says which filters were used last (`filters.warm`).
_LANGUAGES_BY_VERSION: dict[str, dict[str, tuple[str, ...]]] = {}
_VERSIONS_KEPT = 64


def _languages_by_script(index: IndexVersion) -> dict[str, tuple[str, ...]]:
    """script -> the languages of the version's replies written in it; empty unless every reply carries a
    language whose script is known (a reply without one could be in any script)."""
    rows = index.reply_language_rows
    if not rows or any(language not in SCRIPT_OF_LANGUAGE for language in rows):
        return {}
    covered = np.zeros(len(index.reply_ids), dtype=bool)  # [R]
    for language_rows in rows.values():
        covered[language_rows] = True
    if not covered.all():
        return {}
    by_script: dict[str, tuple[str, ...]] = {}
    for language in sorted(rows):
        script = SCRIPT_OF_LANGUAGE[language]
        by_script[script] = (*by_script.get(script, ()), language)
    return by_script


def in_script(hits: list[Scored], script: str | None, avoid: Avoid | None = None) -> list[Scored]:
    """The hits written in the conversation's script (or in none: "😂"), if there are any that `avoid`
    lets through.

    A multilingual encoder puts a Korean turn near its English translation, so
    with candidates in both languages a Korean conversation could be answered
    in English. With no such hit in its script (an English-only candidate set, or
    a turn like "electric sheep을 꿨습니다." whose only Latin hit is its own echo),
    the best hits answer as they are."""
    if script is None:
        return hits
    # An ASCII reply is Latin or letterless: no character-by-character look on the common path.
    latin = script == "Latin"
    same = [
        h
        for h in hits
        if ((latin and h.text.isascii()) or script_of([h.text]) in (script, None))
        and (avoid is None or not avoid.blocks(h.text, h.id, h.reply_row))
    ]
    return same or hits


def kept(hits: list[Scored], script: str | None, avoid: Avoid) -> Iterator[Scored]:
    """`distinct(in_script(hits, script, avoid), len(hits), avoid)`, lazily and with each hit checked
    once: the echo check is most of a hit's cost, and a caller takes the first few."""
    latin = script == "Latin"
    seen: set[int] = set()
    for hit in hits:
        in_its_script = script is None or (latin and hit.text.isascii()) or script_of([hit.text]) in (script, None)
        if in_its_script and hit.reply_row not in seen and not avoid.blocks(hit.text, hit.id, hit.reply_row):
            seen.add(hit.reply_row)
            yield hit
    if not seen and script is not None:  # none in its script that may answer: the best hits, as they are
        yield from distinct(hits, len(hits), avoid)


# A few stored texts can be echoes or excluded; search this much deeper than k.
OVERFETCH = 8


def query_similarity(
    serving: Serving,
    query_vector: np.ndarray,
    k: int,
    avoid: Avoid,
    text: str,
    script: str | None = None,
    laps: Laps | None = None,
    only: Admitted | None = None,
) -> list[Scored]:
    """Stored queries nearest to the last utterance -> the replies paired with them.

    `text`, the last utterance itself: a stored query equal to it once
    normalised comes first with score 1.0, the cosine of identical inputs,
    which the 8-bit codes would blur to about 0.997. `script`: the
    conversation's; replies in it are kept when there are any (`in_script`).
    `only`: the rows a request's filter admits; the search keeps to them."""
    return distinct(_query_hits(serving, query_vector, k, avoid, text, script, laps, only), k, avoid)


def _query_hits(
    serving: Serving,
    query_vector: np.ndarray,
    k: int,
    avoid: Avoid,
    text: str,
    script: str | None,
    laps: Laps | None,
    only: Admitted | None,
    narrow: bool = False,
    at_least: float | None = None,
) -> list[Scored]:
    """`query_similarity`'s hits, best first, before `distinct` drops repeats and what `avoid` blocks.
    `narrow`: from the cheapest search, whose first hit only says whether query similarity answers.
    `at_least`: none at all unless the best score reaches it (no hit after it scores higher)."""
    index = serving.index
    exact = index.query_rows_by_text.get(normalize(text), [])
    if only is not None:
        exact = [row for row in exact if only.queries.admits(row)]
    # Several stored queries can share a reply, and blocked replies are
    # dropped afterwards, so over-fetch.
    with lap(laps, "search_queries"):
        depth = 2 * k + len(avoid) + OVERFETCH
        scores, rows = _search(index, "queries", query_vector, depth, only, narrow)
    if at_least is not None and not exact and not (len(scores) and scores[0] >= at_least):
        return []
    ranked = [(1.0, row) for row in exact] + [
        (score, row) for score, row in zip(scores.tolist(), rows.tolist(), strict=True) if row not in exact
    ]
    hits = []
    for score, row in ranked:
        reply_row = int(index.query_reply_rows[row])
        hits.append(
            Scored(reply_row, index.reply_ids[reply_row], index.reply_texts[reply_row], score, "query_similarity")
        )
    return in_script(hits, script, avoid)


def reply_matching(
    serving: Serving,
    context_vector: np.ndarray,
    k: int,
    avoid: Avoid,
    poly_vectors: np.ndarray | None = None,
    rerank_depth: int = 50,
    script: str | None = None,
    laps: Laps | None = None,
    only: Admitted | None = None,
) -> list[Scored]:
    """Stored replies scored directly against the whole context.

    context_vector: [D]. With poly_vectors ([m, D]) the FAISS top
    `rerank_depth` are rescored by the poly head before the top k are taken.
    At least `DEPTH` hits come back, for the confidence features;
    the caller keeps k. `script`: the conversation's (`in_script`). `only`:
    the rows a request's filter admits.
    """
    found = reply_hits(serving, context_vector, k, avoid, poly_vectors, rerank_depth, script, laps, only)
    return list(itertools.islice(found, max(k, DEPTH)))


def reply_hits(
    serving: Serving,
    context_vector: np.ndarray,
    k: int,
    avoid: Avoid,
    poly_vectors: np.ndarray | None = None,
    rerank_depth: int = 50,
    script: str | None = None,
    laps: Laps | None = None,
    only: Admitted | None = None,
) -> Iterator[Scored]:
    """`reply_matching`'s hits, best first, checked against `avoid` only as they are taken: a caller
    that passes some over (the mood guard, `served`) takes the next from the same search."""
    index = serving.index
    wanted = max(k, DEPTH)
    depth = max(wanted, rerank_depth) if poly_vectors is not None else wanted
    with lap(laps, "search_replies"):
        scores, rows = _search(index, "replies", context_vector, depth + len(avoid) + OVERFETCH, only)
    if poly_vectors is not None and len(rows):
        if serving.reranker is None:
            raise ValueError("poly vectors given but the bundle has no poly head")
        with lap(laps, "rerank"):
            replies = index.reply_vectors(rows)  # [K, D]
            scores = serving.reranker.rescore(poly_vectors, scores, replies)  # [K]
            order = np.argsort(-scores, kind="stable")
            scores, rows = scores[order], rows[order]
    hits = [
        Scored(row, index.reply_ids[row], index.reply_texts[row], score, "reply_matching")
        for score, row in zip(scores.tolist(), rows.tolist(), strict=True)
    ]
    return kept(hits, script, avoid)


def served(hits: Iterable[Scored], k: int, guard: MoodGuard | None) -> list[Scored]:
    """The first k of reply matching's hits that the mood guard lets through. Only these are served,
    so only these may need the turn read: the confidence features read the hits before the guard, as
    they were fitted (models/walk.py), and a request whose served hits take no side never reads it."""
    return list(itertools.islice((h for h in hits if guard is None or not guard.blocks(h.reply_row)), k))


def reaction(
    serving: Serving,
    reading: TurnReading | None,
    context_vector: np.ndarray,
    k: int,
    avoid: Avoid,
    script: str | None,
    rule: Filter | None = None,
) -> list[Scored]:
    """The reactions that fit this context best, from a set that speaks its language (`script`: the
    conversation's, `conversation_script`). `reading`: the last turn as the classifier reads it (a
    reaction model: through its own encoder, with its valence; the bundle's own head: its vector).

    Reactions uploaded with the candidates come first, nearest to the context
    vector (score: the cosine); else the classifier (score: the class
    probability), if its language fits. A reaction is no exception to the echo
    rule: "haha" after "haha" says the user's own words back. Reactions are
    candidates too: `rule` filters them as it filters replies."""
    rows = serving.uploaded_reactions(script, rule)
    index = serving.index
    if len(rows) and index.reaction_vectors is not None:
        scores = index.reaction_vectors[rows] @ context_vector  # [X']
        order = np.argsort(-scores, kind="stable")
        hits = [
            Scored(-1, index.reaction_ids[rows[i]], index.reaction_texts[rows[i]], float(scores[i]), "reaction")
            for i in order
        ]
    elif (
        (language := serving.classifier_language(script, rule)) is not None
        and reading is not None
        and (classifier := serving.reactions) is not None
    ):
        labels = classifier.labels_in(language)
        hits = [
            Scored(-1, f"reaction:{c}", labels[c], p, "reaction")
            for c, p in classifier.top(reading.vector(), len(classifier.labels), reading.lean())
        ]
    else:
        return []
    return list(itertools.islice((h for h in hits if not avoid.blocks(h.text, h.id)), k))


@dataclass(frozen=True)
class Answer:
    best: Scored
    candidates: list[Scored]
    reranked: bool = False  # whether the poly head ordered reply matching's candidates
    confidence: float | None = None  # reply matching's, when it ran and the bundle has a confidence model


@dataclass(frozen=True)
class WalkRequest:
    """What one `/reply` asks of the strategies, with the vectors it already has."""

    window: list[str]  # the turns the context vector saw, oldest first
    allowed: Sequence[Strategy]
    k: int
    thresholds: Thresholds
    avoid: Avoid
    query_vector: np.ndarray | None  # [D] the last turn, when query similarity may answer
    context_vector: np.ndarray | None  # [D] the context's, when reply matching or a reaction may
    poly_vectors: np.ndarray | None  # [m, D] when reply matching reranks
    script: str | None  # the window's, `conversation_script(window)`: worked out once a request
    rerank_depth: int = 50
    threshold_given: bool = False  # the request set its own reply-matching threshold: no rolling share
    laps: Laps | None = None  # where the searches, the rerank and the reactions add their seconds
    rule: Filter | None = None  # which candidates the request allows (tags, language, ids)
    # Search only the replies in the conversation's language, where the version says which that is
    # (`answer_language`); False: every language competes (a request's filter language "any").
    route_language: bool = True
    # [D] what the bundle's own reaction head reads: in the per-turn way the last turn's own vector,
    # a single text as the head was trained on; None: the context vector.
    turn_vector: np.ndarray | None = None


def walk(serving: Serving, request: WalkRequest) -> Answer | None:
    """`walk_in`, searching only the replies in the conversation's language where the version has one
    (`answer_language`). If every one of them is blocked, the replies in any language may answer: a
    reply beats none, as in `in_script`."""
    language = answer_language(serving.index, request.script, request.rule) if request.route_language else None
    answer = walk_in(serving, request, language)
    if answer is None and language is not None:
        answer = walk_in(serving, request, None)
    return answer


def walk_in(serving: Serving, request: WalkRequest, language: str | None) -> Answer | None:
    """The strategies in the fixed order (docs/architecture.md); None when every candidate is blocked.
    `language`: search only the replies in it (reactions go by the conversation's script already,
    and by the request's own filter).

    1. query similarity answers if its top cosine reaches its threshold;
    2. reply matching answers if its confidence reaches its threshold, or if
       no reaction could answer instead;
    3. otherwise a reaction answers, with reply matching's hits as the
       alternatives after it.

    If nothing is confident and no later strategy is allowed, the last one
    tried answers anyway: a low-confidence reply beats no reply.
    """
    k, allowed, thresholds, script = request.k, request.allowed, request.thresholds, request.script
    rule = request.rule or None  # an empty filter admits everything: no selector at all
    searched = replace(rule or Filter(), language=language) if language is not None else rule
    # Tags and language select rows in the search; excluded ids are dropped after it (core/filters.py).
    only = admitted(serving.index, searched) if searched else None
    avoid = replace(request.avoid, ids=request.avoid.ids | rule.exclude_ids) if rule else request.avoid
    reading = turn_reading(serving, request)
    moods = serving.index.reply_moods
    guard = MoodGuard(moods, reading) if reading is not None and moods is not None else None
    guarded = replace(avoid, mood=guard)  # what is served must also pass the mood guard
    can_react = "reaction" in allowed and serving.reactions_apply(script, rule)
    query_hits: Callable[[], list[Scored]] | None = None  # the fallback's: rarely needed, so searched only then
    if "query_similarity" in allowed and request.query_vector is not None:
        query_hits = partial(
            _query_hits, serving, request.query_vector, k, guarded, request.window[-1], script, request.laps, only
        )
        # It answers only on a near copy of a stored query (6-7% of test turns), which the narrowest
        # search finds when there is one; only then do its hits need the full search. The hits come
        # best first, so the first under the threshold ends the look: no hit after it could answer.
        at_least = thresholds.query_similarity
        looked = query_hits(narrow=True, at_least=at_least)
        best = next((h for h in looked if h.score < at_least or not guarded.blocks(h.text, h.id, h.reply_row)), None)
        if best is not None and best.score >= at_least:
            hits = distinct(query_hits(), k, guarded)
            if hits and hits[0].score >= at_least:
                return Answer(hits[0], hits)
    matched: list[Scored] = []  # reply matching's hits that may be served
    confidence = None
    vector = request.context_vector
    if "reply_matching" in allowed and vector is not None:
        ranked = reply_hits(
            serving, vector, k, avoid, request.poly_vectors, request.rerank_depth, script, request.laps, only
        )
        found = list(itertools.islice(ranked, max(k, DEPTH)))  # what the confidence features read
        matched = served(itertools.chain(found, ranked), k, guard)
        if found:
            threshold = thresholds.reply_matching
            if serving.confidence is not None:
                features = confidence_features([h.score for h in found], request.window, found[0].text)
                confidence = serving.confidence(features)
                if serving.share is not None:
                    serving.share.observe(confidence)
                    if not request.threshold_given:
                        threshold = serving.share.threshold()
            sure = (found[0].score if confidence is None else confidence) >= threshold
            if matched and (sure or not can_react):
                return Answer(matched[0], matched, request.poly_vectors is not None, confidence)
    if can_react and vector is not None:
        with lap(request.laps, "reactions"):
            read = reading or turn_reading(serving, request, vector)
            reactions = reaction(serving, read, vector, k, guarded, script, rule)
        if reactions:
            # The retrieved replies it passed over are the alternatives worth showing.
            shown = [reactions[0], *matched][:k] if matched else reactions
            return Answer(reactions[0], shown, False, confidence)
    if matched:
        return Answer(matched[0], matched, request.poly_vectors is not None, confidence)
    fallback = distinct(query_hits(), k, guarded) if query_hits else []
    return Answer(fallback[0], fallback) if fallback else None


def turn_reading(serving: Serving, request: WalkRequest, vector: np.ndarray | None = None) -> TurnReading | None:
    """The last turn as the reaction classifier reads it, where it has a valence model (what the mood
    guard reads) or where `vector` is given (a reaction answers). The bundle's own head reads the
    turn's vector where the per-turn way has one, else the context's."""
    classifier = serving.reactions
    if classifier is None or (classifier.valence is None and vector is None):
        return None
    own = request.turn_vector if request.turn_vector is not None else request.context_vector
    return TurnReading(request.window[-1], classifier, own if own is not None else vector, request.laps)


def search_queries(serving: Serving, vector: np.ndarray, k: int) -> tuple[list[float], list[int]]:
    """The k stored queries nearest to vector [D]: (scores, query rows)."""
    scores, rows = _search(serving.index, "queries", vector, k)
    return scores.tolist(), rows.tolist()
