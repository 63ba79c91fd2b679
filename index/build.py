"""Candidates -> a validated, committed index version (the command line: `python -m index`).

Every distinct text is encoded once, as a stored turn (the reply side): a turn
is most often both a stored reply and a stored query (90k of the 98k distinct
chitchat texts), and a stored query is compared with a live last turn encoded
the same way (`IndexManifest.query_side`), so one vector serves both indexes.
Encoding stored queries as contexts too cost a second pass over every text
where a bundle prefixes the sides differently (e5's "query: " and "passage: "):
half the build.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import faiss
import numpy as np
from tqdm import tqdm

from core import ann
from core.encoder import Encoder
from core.records import Candidate
from core.store import QUERY_INDEX, REACTION_INDEX, REPLY_INDEX, IndexManifest, IndexStore, Tables
from core.text import normalize
from core.valence import Valence
from index.confidence_quantiles import quantiles, sampled, stored_reply_confidences
from index.encode_cache import EncodeCache

log = logging.getLogger(__name__)

SELF_RETRIEVAL_SAMPLE = 200
# A stored reply must find itself. A broken index (misaligned rows, wrong
# vectors) scores near 0; HNSW alone loses a few percent here, as much as its
# recall@10 target allows.
MIN_SELF_RETRIEVAL = ann.RECALL_TARGET


def tables(candidates: Sequence[Candidate]) -> Tables:
    """Replies deduplicated by normalised text (first id wins); a query row per
    distinct (normalised query, reply) pair, the first pair of a query first. A
    reply row carries the tags and languages of every record with its text."""
    reply_row: dict[str, int] = {}
    t = Tables([], [], [], [])
    seen_queries: set[tuple[str, int]] = set()
    tag_rows: dict[str, set[int]] = {}
    language_rows: dict[str, set[int]] = {}
    for c in candidates:
        if c.kind == "reaction":
            t.reaction_ids.append(c.key)
            t.reaction_texts.append(c.reply)
            t.reaction_languages.append(c.language or "")
            t.reaction_tags.append(list(c.tags))
            continue
        key = normalize(c.reply)
        if key not in reply_row:
            reply_row[key] = len(t.reply_texts)
            t.reply_ids.append(c.key)
            t.reply_texts.append(c.reply)
        for tag in c.tags:
            tag_rows.setdefault(tag, set()).add(reply_row[key])
        if c.language:
            language_rows.setdefault(c.language, set()).add(reply_row[key])
        if c.query:
            # One row per distinct (query, reply): "hi" answered one way for kids and another
            # for adults must stay two rows, or a filter admitting one would lose its query.
            pair = (normalize(c.query), reply_row[key])
            if pair not in seen_queries:
                seen_queries.add(pair)
                t.query_texts.append(c.query)
                t.query_reply_rows.append(reply_row[key])
    t.reply_tag_rows = {tag: sorted(rows) for tag, rows in sorted(tag_rows.items())}
    t.reply_language_rows = {lang: sorted(rows) for lang, rows in sorted(language_rows.items())}
    return t


@dataclass
class KnownVectors:
    """Vectors an earlier version computed with the same bundle, by exact text.

    A rebuild encodes only texts it has not seen: a reindex that appends a few
    candidates, or one that only changes the ANN settings, costs seconds. The
    vectors stay in the earlier version's indexes, at 8 bits; each index is read
    only while a side is gathered, and only the rows reused are decoded. A
    stored turn's vector is the same in either index, except in a version from
    before `query_side`, whose query index holds context vectors: only its reply
    index is read.
    """

    rows: dict[str, dict[str, int]]  # REPLY_INDEX or QUERY_INDEX -> text -> row
    store: IndexStore | None = None
    version: str | None = None

    @classmethod
    def load(cls, store: IndexStore, version: str) -> KnownVectors:
        t = store.tables(version)
        rows = {REPLY_INDEX: {text: i for i, text in enumerate(t.reply_texts)}}
        if store.manifest(version).query_side == "reply":
            rows[QUERY_INDEX] = {text: i for i, text in enumerate(t.query_texts)}
        return cls(rows, store, version)

    @classmethod
    def empty(cls) -> KnownVectors:
        return cls({})

    def __contains__(self, text: str) -> bool:
        return any(text in rows for rows in self.rows.values())

    def probes(self) -> np.ndarray | None:
        """[P, D] the earlier version's recall probes (`IndexStore.probes`); None when it kept none."""
        return self.store.probes(self.version) if self.store and self.version else None

    def index(self, name: str) -> faiss.Index | None:
        """The earlier version's REPLY_INDEX or QUERY_INDEX; None when there is none."""
        if self.store is None or self.version is None:
            return None
        return self.store.stored_index(self.version, name)


ENCODE_CHUNK = 1024  # texts a build encodes at a time, length-sorted: one cache entry, one progress step
DECODE_CHUNK = 8192  # rows decoded from an earlier index at a time: ~12 MB of fp32 at D = 384


@dataclass
class Encoded:
    """The texts no earlier version had, each encoded once as a stored turn (the reply side)."""

    rows: dict[str, int]  # text -> its row
    vectors: np.ndarray  # [U, D]
    chunks: list[list[str]] = field(default_factory=list)  # the plan's chunks, as the cache keys them
    from_cache: int = 0  # texts whose chunk an interrupted build had already encoded


def _gather(wanted: list[str], known: KnownVectors, fresh: Encoded) -> np.ndarray:
    """[N, D] the vector of each wanted text: from an earlier index where it had it, else freshly encoded."""
    out = np.empty((len(wanted), fresh.vectors.shape[1]), dtype=np.float32)  # [N, D]
    left = dict(enumerate(wanted))  # row here -> text, until its vector is found
    for name, rows in known.rows.items():
        reused = [(i, rows[text]) for i, text in left.items() if text in rows]  # (row here, row there)
        old = known.index(name) if reused else None
        for start in range(0, len(reused), DECODE_CHUNK):
            here, there = zip(*reused[start : start + DECODE_CHUNK], strict=True)
            assert old is not None
            out[list(here)] = ann.vectors_of(old, np.array(there))  # [C, D]
        del old
        for i, _ in reused:
            del left[i]
    for i, text in left.items():
        out[i] = fresh.vectors[fresh.rows[text]]
    return out


def encode_missing(
    encoder: Encoder,
    t: Tables,
    known: KnownVectors,
    chunk: int = ENCODE_CHUNK,
    progress: bool = True,
    on_fraction: Callable[[float], None] = lambda fraction: None,
    cache: EncodeCache | None = None,
) -> Encoded:
    texts = [x for x in dict.fromkeys(t.reply_texts + t.query_texts) if x not in known]
    vectors = np.empty((len(texts), encoder.dim), dtype=np.float32)  # [U, D]
    order = np.argsort([len(x) for x in texts], kind="stable")
    bar = tqdm(total=len(texts), desc="encode", unit="text", disable=not progress, file=sys.stderr)
    chunks, from_cache = [], 0
    for start in range(0, len(texts), chunk):
        rows = order[start : start + chunk]  # length-sorted chunks batch with little padding
        batch = [texts[i] for i in rows]
        chunks.append(batch)
        done = cache.get(batch) if cache else None
        if done is None:
            done = encoder.encode(batch, "reply")  # [C, D]
            if cache:
                cache.put(batch, done)
        else:
            from_cache += len(batch)
        vectors[rows] = done
        bar.update(len(rows))
        on_fraction(min(1.0, (start + chunk) / len(texts)))
    bar.close()
    return Encoded({text: i for i, text in enumerate(texts)}, vectors, chunks, from_cache)


def self_retrieval(index: faiss.Index, vectors: np.ndarray, seed: int = 0) -> float:
    """Share of sampled rows that find themselves among their 10 nearest.

    A row counts if its own id comes back, or a hit at (near) full score: two
    normalised-distinct replies such as "hello" and "hello." can share a
    vector. Top-10 rather than top-1, because HNSW at the efSearch tuned for
    recall can rank one of many near-duplicates above the row itself; what
    this check must catch is a broken index (misaligned rows, wrong vectors).
    """
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(vectors), size=min(len(vectors), SELF_RETRIEVAL_SAMPLE), replace=False)
    scores, found = index.search(np.ascontiguousarray(vectors[rows]), 10)  # [S, 10] each
    hit = (found == rows[:, None]).any(axis=1) | (scores[:, 0] >= 0.999)  # [S]
    return float(hit.mean())


PROFILE_SAMPLE = 1000


def neighbour_profile(index: faiss.Index, vectors: np.ndarray, seed: int = 0) -> dict[str, float]:
    """Percentiles of the cosine between a stored text and its nearest other stored text.

    For a bundle with no calibration this is what a query-similarity threshold
    can honestly start from: at the 99th percentile, only a last turn closer to
    a stored query than nearly all stored queries are to each other answers."""
    if len(vectors) < 2:
        return {}
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(vectors), size=min(len(vectors), PROFILE_SAMPLE), replace=False)
    scores, found = index.search(np.ascontiguousarray(vectors[rows]), 2)  # [S, 2]
    other = np.where(found[:, 0] == rows, scores[:, 1], scores[:, 0])  # [S]: the nearest that is not itself
    return {f"p{q}": round(float(np.percentile(other, q)), 4) for q in (50, 90, 99)}


def build_version(
    candidates: Sequence[Candidate],
    encoder: Encoder,
    bundle_checksum: str,
    store: IndexStore,
    source: str,
    progress: bool = True,
    on_progress: Callable[[str, float], None] = lambda stage, fraction: None,
    reuse: bool = True,
    cache: EncodeCache | None = None,
    valence: Valence | None = None,
) -> IndexManifest:
    """Builds, validates and commits a new version. Does not make it current.

    With reuse, texts already embedded by the newest version built with the
    same bundle are not encoded again. With `cache`, each encoded chunk is kept
    on disk until the version commits: a build killed halfway and run again
    encodes only the chunks it had not finished. With `valence`, each stored reply's valence is
    scored from its text and kept with the version (REPLY_VALENCE), for the mood guard."""
    started = time.perf_counter()
    t = tables(candidates)
    if not t.reply_texts:
        raise ValueError("no candidates with a reply")
    on_progress("encode", 0.0)
    previous = store.latest_for(bundle_checksum) if reuse else None
    known = KnownVectors.load(store, previous) if previous else KnownVectors.empty()
    fresh = encode_missing(
        encoder, t, known, progress=progress, on_fraction=lambda f: on_progress("encode", f), cache=cache
    )
    stages = {"encode": round(time.perf_counter() - started, 2)}  # tables and the earlier version's texts too
    chunks, from_cache = fresh.chunks, fresh.from_cache
    staging = store.stage()
    try:
        manifest = _index_and_commit(
            t,
            candidates,
            known,
            fresh,
            encoder,
            store,
            staging,
            bundle_checksum=bundle_checksum,
            source=source,
            started=started,
            stages=stages,
            on_progress=on_progress,
            valence=valence,
        )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if cache:
        cache.forget(chunks)
    if from_cache:
        log.info("%d texts from chunks an interrupted build had encoded", from_cache)
    return manifest


# An append that brings under this share of new texts keeps the earlier version's starting
# confidences: its replies' spread has barely moved, and a fresh sample would encode ~500 texts
# (about 2 s without VNNI, more under load) to say so.
CARRY_BELOW_NEW = 0.1


def _small_append(t: Tables, known: KnownVectors, fresh: Encoded) -> bool:
    return known.version is not None and len(fresh.rows) < CARRY_BELOW_NEW * len(t.reply_texts)


def _starting_confidences(
    t: Tables, known: KnownVectors, fresh: Encoded, encoder: Encoder, reply_index: faiss.Index, said: np.ndarray | None
) -> list[float]:
    """`IndexManifest.confidence_quantiles` for this version (`index/confidence_quantiles.py`). said: [S, D] its
    sample of stored replies as contexts, where this build encoded it; else they are encoded here."""
    earlier = known.store.manifest(known.version).confidence_quantiles if known.store and known.version else []
    if earlier and _small_append(t, known, fresh):
        return earlier
    if said is None:
        return quantiles(stored_reply_confidences(reply_index, t.reply_texts, encoder))
    vectors = dict(zip(sampled(t.reply_texts), said, strict=True))
    return quantiles(
        stored_reply_confidences(
            reply_index, t.reply_texts, encoder, lambda texts: np.stack([vectors[x] for x in texts])
        )
    )


def _index_and_commit(
    t: Tables,
    candidates: Sequence[Candidate],
    known: KnownVectors,
    fresh: Encoded,
    encoder: Encoder,
    store: IndexStore,
    staging: Path,
    *,
    bundle_checksum: str,
    source: str,
    started: float,
    stages: dict[str, float],
    on_progress: Callable[[str, float], None],
    valence: Valence | None = None,
) -> IndexManifest:
    """One side at a time: its fp32 vectors are gathered, indexed, checked and written to the staging
    directory, and dropped with its index before the other side's are gathered. Holding both sides
    at once, with both earlier indexes, was a reindex's peak: ~500 MB above the serving process at 96k."""
    on_progress("index", 0.0)
    lap = time.perf_counter()
    build = _Build(t, known, fresh, encoder, store, staging)
    reply_report, checks, confidence_quantiles = _index_replies(build)
    stages["replies"], lap = round(time.perf_counter() - lap, 2), time.perf_counter()
    query_report, profile = _index_queries(build, checks, on_progress)
    stages["queries"], lap = round(time.perf_counter() - lap, 2), time.perf_counter()

    on_progress("commit", 0.0)
    if t.reaction_texts:
        store.write_index(staging, REACTION_INDEX, ann.exact(encoder.encode(t.reaction_texts, "reply")))
    store.write_texts(staging, candidates, t)
    if valence is not None:
        scored = time.perf_counter()
        store.write_reply_valence(staging, valence.digest, valence.reply_log_odds(t.reply_texts))
        stages["valence"] = round(time.perf_counter() - scored, 2)
    stages["commit"] = round(time.perf_counter() - lap, 2)  # but the final fsync and rename
    created = datetime.now(UTC)
    digest = hashlib.sha1("\n".join(t.reply_ids).encode() + bundle_checksum.encode()).hexdigest()[:6]
    manifest = IndexManifest(
        version=f"v{created:%Y%m%dT%H%M%S%f}-{digest}",
        bundle_checksum=bundle_checksum,
        bundle_name=encoder.manifest.name,
        dim=encoder.dim,
        replies=len(t.reply_texts),
        queries=len(t.query_texts),
        source=source,
        created_at=created.isoformat(timespec="seconds"),
        build_seconds=round(time.perf_counter() - started, 2),
        stage_seconds=stages,
        ann={"replies": reply_report.to_dict(), "queries": query_report.to_dict()},
        checks=checks,
        encoded=len(fresh.rows),
        query_side="reply",
        profile=profile,
        confidence_quantiles=confidence_quantiles,
    )
    store.commit(staging, manifest)
    return manifest


@dataclass(frozen=True)
class _Build:
    """What indexing either side reads: the version's tables, the vectors earlier versions hold and
    those encoded now, the encoder, and the staging directory of `store` its files go to."""

    t: Tables
    known: KnownVectors
    fresh: Encoded
    encoder: Encoder
    store: IndexStore
    staging: Path


def _index_replies(build: _Build) -> tuple[ann.AnnReport, dict[str, float], list[float]]:
    """The reply side, indexed, checked and written (its vectors dropped on return): its ANN report,
    the checks so far, and the version's starting confidences."""
    t, known, fresh, encoder = build.t, build.known, build.fresh, build.encoder
    # Replies are searched with context vectors: stored turns said as one-turn contexts are the
    # nearest thing to real ones, to check the graph's recall with and to start the confidences
    # from (`index/confidence_quantiles.py`, whose sample this is). 500 texts are 0.5% of a full build's
    # passes but most of an append of a few candidates, which checks with the earlier version's.
    carried = known.probes() if _small_append(t, known, fresh) else None
    said = encoder.encode(sampled(t.reply_texts), "context") if carried is None else None  # [S, D]
    probes = carried if carried is not None else said  # [P, D]
    reply_vectors = _gather(t.reply_texts, known, fresh)  # [R, D]
    reply_index, reply_report = ann.build(reply_vectors, "graph", probes=probes)
    checks = {"reply_self_retrieval": self_retrieval(reply_index, reply_vectors)}
    confidence_quantiles = _starting_confidences(t, known, fresh, encoder, reply_index, said)
    if reply_index.d != encoder.dim or reply_index.ntotal != len(t.reply_texts):
        raise RuntimeError(f"index validation failed: dim {reply_index.d}, rows {reply_index.ntotal}")
    build.store.write_index(build.staging, REPLY_INDEX, reply_index)
    if probes is not None:
        build.store.write_probes(build.staging, probes)
    return reply_report, checks, confidence_quantiles


def _index_queries(
    build: _Build, checks: dict[str, float], on_progress: Callable[[str, float], None]
) -> tuple[ann.AnnReport, dict[str, float]]:
    """The query side, indexed, checked with the reply side's `checks` (RuntimeError below the bar)
    and written: its ANN report and the stored queries' neighbour profile."""
    query_vectors = _gather(build.t.query_texts, build.known, build.fresh)  # [Q, D]
    build.fresh.vectors = np.empty((0, build.encoder.dim), np.float32)  # its rows are in the two indexes now
    query_index, query_report = (
        ann.build(query_vectors, "inverted")
        if len(query_vectors)
        else (ann.exact(query_vectors), ann.AnnReport("flat", 0, 1.0))
    )
    on_progress("validate", 0.0)
    if len(query_vectors):
        checks["query_self_retrieval"] = self_retrieval(query_index, query_vectors)
    failed = {k: v for k, v in checks.items() if v < MIN_SELF_RETRIEVAL}
    if failed:
        raise RuntimeError(f"index validation failed: {checks}")
    profile = {f"query_neighbour_{k}": v for k, v in neighbour_profile(query_index, query_vectors).items()}
    build.store.write_index(build.staging, QUERY_INDEX, query_index)
    return query_report, profile


def corpus_candidates(max_context_turns: int, path: Path | None = None, language: str | None = None) -> list[Candidate]:
    """The chitchat train split's candidates, each with `language` if given."""
    from index.corpus import candidate_records, load_pairs

    pairs = load_pairs("train", max_context_turns, path)
    return [Candidate(reply=r.reply, query=r.query, language=language) for r in candidate_records(pairs)]


def korean_candidates(max_context_turns: int) -> list[Candidate]:
    """The shipped Korean conversations' candidates (index/data/README.md), each with language "ko"."""
    from index.corpus import candidate_records, load_korean_conversations, pairs_from

    pairs = pairs_from(load_korean_conversations(), max_context_turns)
    return [Candidate(reply=r.reply, query=r.query, language="ko") for r in candidate_records(pairs)]


# What the default set is built from (`python -m index`, the first build behind `make run`'s slice).
ENGLISH_SOURCE = "chitchat:train"
DEFAULT_SOURCE = "chitchat:train+korean"


def default_candidates(max_context_turns: int, path: Path | None = None, korean: bool = True) -> list[Candidate]:
    """The default set: chitchat's train split in English and, with `korean`, the shipped Korean
    conversations. Every candidate carries its language, so a turn is answered from the replies in
    its own (`core.retriever.answer_language`)."""
    english = corpus_candidates(max_context_turns, path, "en")
    return english + korean_candidates(max_context_turns) if korean else english
