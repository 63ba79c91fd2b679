"""Versioned index directories on the artifact volume, and the one place
that reads or writes a version's files.

    indexes/
      CURRENT                  the serving version's name (replaced atomically)
      v20261122T031500-1a2b3c/ one immutable version
        manifest.json          what it is: bundle checksum, counts, ANN settings, checks
        replies.faiss          the stored replies' vectors (8-bit codes) and search structure
        queries.faiss          the stored queries', likewise
        candidates.json.gz     reply ids and texts, query texts, query -> reply rows
        records.jsonl.gz       the candidate records it was built from, whole: a rollback restores them
        records.count          how many records that is (the limit on candidates over every set)
        reactions.faiss        the vectors of reactions the upload brought, if any (exact search: a few dozen)
      .staging-*/              a build in progress, with an OWNER file naming its process;
                               removed once that process is gone (`remove_staging`)

A version is written into a staging directory, fsynced and renamed into place,
so a reader sees either the whole version or none of it. The vectors live in
the .faiss files only; the rerank and the next build read them back from there.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np

from core import ann, failpoints
from core.files import fsync_dir, write_atomic
from core.process import gone, this_process
from core.records import Candidate, from_json, to_json
from core.text import normalize

MANIFEST = "manifest.json"
POINTER = "CURRENT"
# The versions the pointer has named, oldest first, one a line: what a rollback returns to is what
# served before, not the version before by name (a rollback, an upload, a rollback would otherwise
# serve the version rolled back from).
HISTORY = "HISTORY"
MAX_HISTORY = 64
STAGING_PREFIX = ".staging-"
REPLY_INDEX = "replies.faiss"
QUERY_INDEX = "queries.faiss"
REACTION_INDEX = "reactions.faiss"  # only when the upload brought reactions
# [S, D] float32 context vectors a build checked its reply graph's recall with (`index.build`): an
# append reuses them rather than encode them again. A version from before them has none.
PROBES = "probes.npy"
# The stored replies' valence (core/valence.py): [R] log-odds and the digest of the valence model that
# scored them. A version without it, or scored by another model, is scored when it loads.
REPLY_VALENCE = "reply_valence.npz"
# Text compresses about 3:1 and is read once per load: gzip keeps a version of ~100k candidates under 150 MB.
TABLES = "candidates.json.gz"
RECORDS = "records.jsonl.gz"
RECORD_COUNT = "records.count"  # how many records RECORDS holds: the limit on candidates reads it, not them
# In a staging directory: the process writing it, {"host", "pid", "started", "boot", "pidns", "start", "token"}
# (`core.process.this_process`).
OWNER = "OWNER"
# What `index.build` names a version: v<UTC time to the microsecond>-<6 hex>. A name from
# elsewhere (a pub/sub message, the pointer file) becomes a path only if it matches.
VERSION_NAME = re.compile(r"v\d{8}T\d{12}-[0-9a-f]{6}")
# Another host's staging directory untouched this long is abandoned: a build takes minutes, and a
# process on another host cannot be asked whether it is alive.
STAGING_ABANDONED_S = 3600


class BadVersion(ValueError):
    """A version name that is not one `index.build` writes."""


def check_version(name: str) -> str:
    if not VERSION_NAME.fullmatch(name):
        raise BadVersion(f"not an index version name: {name[:80]!r}")
    return name


@dataclass
class Tables:
    """The texts behind the index rows."""

    reply_ids: list[str]  # [R]
    reply_texts: list[str]  # [R]
    query_texts: list[str]  # [Q]
    query_reply_rows: list[int]  # [Q] query row -> the reply row it was paired with
    # Reactions uploaded with the candidates, by id, text and language; none by default.
    reaction_ids: list[str] = field(default_factory=list)  # [X]
    reaction_texts: list[str] = field(default_factory=list)  # [X]
    reaction_languages: list[str] = field(default_factory=list)  # [X]
    reaction_tags: list[list[str]] = field(default_factory=list)  # [X]
    # Posting lists over reply rows for request-time filters (`core.filters`), ascending rows.
    # Replies are deduplicated by text, so a reply carries every tag and language that any
    # record with its text gives it: `tags_none: ["mature"]` drops it if any record says so.
    reply_tag_rows: dict[str, list[int]] = field(default_factory=dict)  # tag -> rows
    reply_language_rows: dict[str, list[int]] = field(default_factory=dict)  # language -> rows


@dataclass
class IndexManifest:
    version: str
    bundle_checksum: str  # vectors from one model are never searched with another
    bundle_name: str
    dim: int
    replies: int
    queries: int
    source: str  # what the candidates came from, e.g. "chitchat:train"
    created_at: str
    build_seconds: float
    ann: dict[str, dict[str, Any]] = field(default_factory=dict)  # "replies"/"queries" -> AnnReport
    checks: dict[str, float] = field(default_factory=dict)  # validation figures measured before commit
    # How alike the stored texts are among themselves (`index.build.neighbour_profile`): what
    # thresholds can start from for a bundle that was never calibrated.
    profile: dict[str, float] = field(default_factory=dict)
    encoded: int = 0  # texts encoded for this version; the rest were reused from an earlier one
    # [101] percentiles of the bundle's reply-matching confidence with stored replies said as
    # contexts (`index/confidence_quantiles.py`): where the reaction share's threshold starts on this
    # version. Empty for a bundle with no confidence model, or a version built before them.
    confidence_quantiles: list[float] = field(default_factory=list)
    # The side the stored queries were encoded on, and so the one a live last turn is encoded on
    # to be compared with them. A build encodes each stored turn once, as a reply (`index.build`);
    # a version from before that encoded its stored queries as contexts.
    query_side: Literal["context", "reply"] = "context"
    # Where build_seconds went: "encode" (the texts no earlier version had), "replies" and "queries"
    # (each side's gather, ANN build, checks and write), "commit" (reactions, texts).
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> IndexManifest:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})


SUBSETS_KEPT = 8


class Memo:
    """A few derived lookups of one immutable version, computed on first use and kept
    (least recently used first out). Searches run in several threads, hence the lock."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def kept(self) -> list[Hashable]:
        """What is kept, least recently used first."""
        with self._lock:
            return list(self._entries)

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = compute()  # outside the lock: two threads may compute it once each, harmlessly
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return value


@dataclass
class IndexVersion:
    """One loaded, immutable version. Requests hold a reference to exactly one."""

    manifest: IndexManifest
    reply_index: faiss.Index
    query_index: faiss.Index
    reply_ids: list[str]  # [R]
    reply_texts: list[str]  # [R]
    query_texts: list[str]  # [Q]
    query_reply_rows: np.ndarray  # [Q] int64: query row -> reply row it was paired with
    reaction_ids: list[str] = field(default_factory=list)  # [X] uploaded reactions, if any
    reaction_texts: list[str] = field(default_factory=list)  # [X]
    reaction_languages: list[str] = field(default_factory=list)  # [X]
    reaction_vectors: np.ndarray | None = None  # [X, D] reply-side vectors
    reaction_tags: list[tuple[str, ...]] = field(default_factory=list)  # [X]
    reply_tag_rows: dict[str, np.ndarray] = field(default_factory=dict)  # tag -> [n] int64 rows, ascending
    reply_language_rows: dict[str, np.ndarray] = field(default_factory=dict)  # language -> [n] int64 rows
    # normalised query text -> its query rows. A stored query typed again scores
    # about 0.997 through the 8-bit codes, under a calibrated threshold near 1;
    # looking it up by text gives it the 1.0 its fp32 cosine is.
    query_rows_by_text: dict[str, list[int]] = field(default_factory=dict)
    # (digest of the valence model, [R] log-odds) as the build scored the replies; None: not scored.
    reply_valence: tuple[str, np.ndarray] | None = None
    # [R] int8 each stored reply's clear side (+1 cheerful, -1 sad, 0 neither), which the mood guard
    # reads (core/mood.py); set once where the version is served with a valence model.
    reply_moods: np.ndarray | None = None
    # What `core.filters` derives from this version once and reuses: compiled filters, ids -> rows.
    memo: Memo = field(default_factory=Memo, repr=False)
    # Filters' admitted rows copied into flat indexes (`filters.exact_subset`): at most
    # SUBSETS_KEPT × 2 sides × 20k rows × 384 bytes, 62 MB, a version.
    subsets: Memo = field(default_factory=lambda: Memo(2 * SUBSETS_KEPT), repr=False)  # both sides of each

    @property
    def version(self) -> str:
        return self.manifest.version

    def reply_vectors(self, rows: np.ndarray) -> np.ndarray:
        """[K, D] the stored replies' vectors at `rows`, read back from the index."""
        return ann.vectors_of(self.reply_index, rows)


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    fsync_dir(directory)


class IndexStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, version: str) -> Path:
        return self.root / check_version(version)

    def versions(self) -> list[str]:
        """Committed versions, oldest first (names sort by creation time)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if VERSION_NAME.fullmatch(p.name) and p.is_dir() and (p / MANIFEST).is_file()
        )

    def manifest(self, version: str) -> IndexManifest:
        return IndexManifest.from_dict(json.loads((self.path(version) / MANIFEST).read_text()))

    def current(self) -> str | None:
        """The serving version: the one pointer every replica follows (Redis only announces changes)."""
        pointer = self.root / POINTER
        try:
            version = pointer.read_text().strip()
        except FileNotFoundError:
            return None
        if not VERSION_NAME.fullmatch(version):
            return None
        return version if (self.path(version) / MANIFEST).is_file() else None

    def set_current(self, version: str, rollback: bool = False) -> None:
        """Points at `version`, and records it in the history; `rollback`: a return to `version`, which
        takes what came after it off the history instead (an undo, not a new step)."""
        if not (self.path(version) / MANIFEST).is_file():
            raise FileNotFoundError(f"no committed index version {version!r}")
        history = self.history()
        if not history and (before := self.current()) not in (None, version):
            history = [before]  # a store from before the history: the pointer named `before` until now
        if rollback and version in history:
            history = history[: len(history) - history[::-1].index(version)]
        elif not history or history[-1] != version:
            history.append(version)
        # The history first: if the pointer's write then fails, the entry after the pointer's is ignored.
        # Two threads (a reindex, a rollback) may write at once: each writes a temporary file of its own.
        write_atomic(self.root / HISTORY, "\n".join(history[-MAX_HISTORY:]) + "\n", sync_dir=True)
        failpoints.hit("store.pointer")
        write_atomic(self.root / POINTER, version + "\n", sync_dir=True)

    def history(self) -> list[str]:
        """The versions the pointer has named, oldest first (empty for a store older than the history)."""
        try:
            lines = (self.root / HISTORY).read_text().split()
        except FileNotFoundError:
            return []
        return [v for v in lines if VERSION_NAME.fullmatch(v)]

    def served_before(self, version: str, usable: Callable[[str], bool] = lambda v: True) -> str | None:
        """The version the pointer named before `version` last came in, if it is still there and
        `usable`; None if the history does not say."""
        history = self.history()
        if version not in history:
            return None
        last = len(history) - 1 - history[::-1].index(version)
        for earlier in reversed(history[:last]):
            if earlier != version and (self.path(earlier) / MANIFEST).is_file() and usable(earlier):
                return earlier
        return None

    def latest_for(self, bundle_checksum: str) -> str | None:
        """The current version if it matches the bundle, else the newest that does."""
        current = self.current()
        if current and self.manifest(current).bundle_checksum == bundle_checksum:
            return current
        matching = [v for v in self.versions() if self.manifest(v).bundle_checksum == bundle_checksum]
        return matching[-1] if matching else None

    def stage(self) -> Path:
        """A staging directory tagged with this process, so that no other replica removes it while it builds."""
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.root))
        (staging / OWNER).write_text(json.dumps(this_process()))
        return staging

    def commit(self, staging: Path, manifest: IndexManifest) -> Path:
        (staging / OWNER).unlink(missing_ok=True)
        (staging / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2) + "\n")
        _fsync_tree(staging)
        final = self.path(manifest.version)
        staging.rename(final)
        _fsync_tree(self.root)
        return final

    def remove_staging(self) -> list[str]:
        """Leftovers of builds whose process is gone; they were never visible to readers.
        A build another live process (a replica, `make index`) is writing is left alone."""
        removed = []
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith(STAGING_PREFIX) and p.is_dir() and _abandoned(p):
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p.name)
        return removed

    def write_index(self, staging: Path, name: str, index: faiss.Index) -> None:
        """One of a version's indexes (REPLY_INDEX, QUERY_INDEX, REACTION_INDEX), into a staging directory."""
        faiss.write_index(index, str(staging / name))

    def write_probes(self, staging: Path, probes: np.ndarray) -> None:
        """[S, D] the context vectors a build checked recall with (PROBES), into a staging directory."""
        with (staging / PROBES).open("wb") as f:
            np.save(f, probes.astype(np.float32))

    def write_reply_valence(self, staging: Path, digest: str, log_odds: np.ndarray) -> None:
        """[R] the stored replies' valence log-odds by the valence model `digest` names (REPLY_VALENCE)."""
        with (staging / REPLY_VALENCE).open("wb") as f:
            np.savez(f, log_odds=log_odds.astype(np.float16), digest=np.array(digest))

    def reply_valence(self, version: str) -> tuple[str, np.ndarray] | None:
        """(digest, [R] float32 log-odds) of the version's REPLY_VALENCE; None without one, or unreadable."""
        try:
            with np.load(self.path(version) / REPLY_VALENCE) as saved:
                return str(saved["digest"]), saved["log_odds"].astype(np.float32)
        except (OSError, ValueError, KeyError):
            return None

    def probes(self, version: str) -> np.ndarray | None:
        """[S, D] the version's PROBES; None for a version from before them, or an unreadable file."""
        try:
            probes: np.ndarray = np.load(self.path(version) / PROBES)
        except (OSError, ValueError):
            return None
        return probes if probes.ndim == 2 else None

    def write_texts(self, staging: Path, records: Sequence[Candidate], tables: Tables) -> None:
        """A version's texts, into a staging directory (`commit` adds the manifest and moves it into place)."""
        with gzip.open(staging / TABLES, "wt", encoding="utf-8", compresslevel=6) as f:
            json.dump(asdict(tables), f, ensure_ascii=False)
        with gzip.open(staging / RECORDS, "wt", encoding="utf-8", compresslevel=6) as f:
            f.writelines(to_json(c) + "\n" for c in records)
        (staging / RECORD_COUNT).write_text(f"{len(records)}\n")

    def records(self, version: str) -> list[Candidate]:
        """The candidate records a version was built from."""
        path = self.path(version) / RECORDS
        if path.is_file():
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return [from_json(line) for line in f if line.strip()]
        # A version from before records were kept: rebuilt from its tables, without metadata.
        t = self.tables(version)
        rebuilt, paired = [], set()
        for query, row in zip(t.query_texts, t.query_reply_rows, strict=True):
            rebuilt.append(Candidate(reply=t.reply_texts[row], query=query))
            paired.add(row)
        replies = enumerate(zip(t.reply_ids, t.reply_texts, strict=True))
        rebuilt += [Candidate(reply=r, id=i) for row, (i, r) in replies if row not in paired]
        return rebuilt

    def record_count(self, version: str) -> int:
        """How many candidate records a version was built from, without reading them: the count the
        build wrote beside them, or for a version from before it, its records counted once (a
        version never changes) or, older still, its replies and queries."""
        return _record_count(str(self.path(version)))

    def tables(self, version: str) -> Tables:
        with gzip.open(self.path(version) / TABLES, "rt", encoding="utf-8") as f:
            return Tables(**json.load(f))

    def stored_index(self, version: str, name: str) -> faiss.Index:
        """One of a version's indexes (REPLY_INDEX or QUERY_INDEX), ready for `ann.vectors_of` on any rows."""
        index = faiss.read_index(str(self.path(version) / name))
        ann.allow_row_lookup(index)
        return index

    def load(self, version: str) -> IndexVersion:
        directory = self.path(version)
        manifest = self.manifest(version)
        tables = self.tables(version)
        reply_index = faiss.read_index(str(directory / REPLY_INDEX))
        query_index = faiss.read_index(str(directory / QUERY_INDEX))
        ann.allow_row_lookup(query_index)  # a filter's admitted stored queries are read back by row
        ann.allow_row_lookup(reply_index)  # ... and an answer's vector, the bot's turn in the per-turn way
        ann.configure(reply_index, ann.AnnReport(**manifest.ann["replies"]))
        ann.configure(query_index, ann.AnnReport(**manifest.ann["queries"]))
        reactions = directory / REACTION_INDEX
        return IndexVersion(
            manifest=manifest,
            reply_index=reply_index,
            query_index=query_index,
            reply_ids=tables.reply_ids,
            reply_texts=tables.reply_texts,
            query_texts=tables.query_texts,
            query_reply_rows=np.asarray(tables.query_reply_rows, dtype=np.int64),
            reaction_ids=tables.reaction_ids,
            reaction_texts=tables.reaction_texts,
            reaction_languages=tables.reaction_languages,
            reaction_tags=[tuple(t) for t in tables.reaction_tags] or [() for _ in tables.reaction_ids],
            reply_tag_rows=_arrays(tables.reply_tag_rows),
            reply_language_rows=_arrays(tables.reply_language_rows),
            reaction_vectors=ann.vectors_of(faiss.read_index(str(reactions))) if reactions.is_file() else None,
            query_rows_by_text=_rows_by_text(tables.query_texts),
            reply_valence=self.reply_valence(version),
        )


def _abandoned(staging: Path) -> bool:
    """On this host: its process has exited (`core.process.gone`). Elsewhere (or untagged, from before
    owners were written, or just created and not yet tagged): untouched for STAGING_ABANDONED_S."""
    try:
        owner = json.loads((staging / OWNER).read_text())
        if owner.get("host") == socket.gethostname():
            return gone(owner)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        touched = max([staging.stat().st_mtime, *(f.stat().st_mtime for f in staging.iterdir())])
    except OSError:  # removed by its owner meanwhile
        return False
    return time.time() - touched > STAGING_ABANDONED_S


@functools.lru_cache(maxsize=1024)
def _record_count(directory: str) -> int:
    path = Path(directory)
    try:
        return int((path / RECORD_COUNT).read_text())
    except (OSError, ValueError):
        pass
    if (path / RECORDS).is_file():
        with gzip.open(path / RECORDS, "rt", encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    manifest = IndexManifest.from_dict(json.loads((path / MANIFEST).read_text()))
    return manifest.replies + manifest.queries


def _arrays(postings: dict[str, list[int]]) -> dict[str, np.ndarray]:
    return {key: np.asarray(rows, dtype=np.int64) for key, rows in postings.items()}


def _rows_by_text(texts: list[str]) -> dict[str, list[int]]:
    rows: dict[str, list[int]] = {}
    for row, text in enumerate(texts):
        rows.setdefault(normalize(text), []).append(row)
    return rows
