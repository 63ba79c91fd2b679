"""The candidate store: the source of truth a reindex builds from.

Redis when configured (one hash, id -> record), otherwise a JSON-lines file
on the artifact volume. Both replace their whole content atomically (RENAME,
`core.files.atomic_file`), so a reader never sees half an upload.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import redis

from core.files import atomic_file
from core.records import Candidate, from_json, to_json
from core.text import normalize

REDIS_KEY = "candidates"  # the default set's; another set's is "set:<name>:candidates"
# f"{key}:written" is set once a store has been written, even if empty since
CHUNK = 5000  # records per Redis round trip
REPORTED_LINES = 100  # of each kind of duplicate
DUPLICATE_RULES = {
    "ids": "same id (or, without ids, the same query and reply) within the upload: the last record wins",
    "stored_ids": "same id as a stored record: the upload replaces the stored record",
    "texts": "same reply text (once normalised) as an earlier record of the upload: kept once, the first id wins",
    "stored_texts": "same reply text (once normalised) as a stored record: kept once, the stored record's id wins",
}


class CandidateStore(Protocol):
    """A set's records as its current version holds them, kept beside the versions so an append need
    not read them back out of one. The pointer is the truth: the store says which version its records
    are (`version`), and a reader whose pointer names another reads that version's records instead."""

    def all(self) -> list[Candidate]: ...
    def count(self) -> int: ...
    def version(self) -> str | None: ...  # the version the records are; None if never written
    def replace(self, candidates: Iterable[Candidate], version: str) -> None: ...
    def remove(self) -> None: ...  # the whole store, when its set is deleted


# A staging hash's expiry, renewed with each chunk written: far longer than a write of the largest
# set takes, short enough that a dead writer's leftovers go the same hour.
STAGING_TTL_S = 3600


class RedisCandidateStore:
    def __init__(self, client: redis.Redis, key: str = REDIS_KEY) -> None:
        self.client = client
        self.key = key  # one hash per candidate set
        self.written_key = f"{key}:written"

    def all(self) -> list[Candidate]:
        records = [from_json(v) for _, v in self.client.hscan_iter(self.key, count=CHUNK)]
        return sorted(records, key=lambda c: c.key)  # a stable order: stable index rows

    def count(self) -> int:
        return int(self.client.hlen(self.key))

    def version(self) -> str | None:
        raw = self.client.get(self.written_key)
        text = raw.decode() if isinstance(raw, bytes) else raw
        return text if isinstance(text, str) and text.startswith("v") else None  # "1": written before versions

    def remove(self) -> None:
        self.client.delete(self.key, self.written_key)

    def replace(self, candidates: Iterable[Candidate], version: str) -> None:
        """Written under a temporary key, then renamed over the live one with the version they are, in
        one transaction. The temporary key expires
        (STAGING_TTL_S after its last chunk) and is deleted on a failed write: one left by a process
        that died mid-write, tens of MB for a 97k set, never outlives it in a Redis that does not evict."""
        staging = f"{self.key}:staging:{uuid.uuid4().hex}"  # pids repeat across containers
        try:
            batch: dict[str, str] = {}
            for c in candidates:
                batch[c.key] = to_json(c)
                if len(batch) >= CHUNK:
                    self._stage(staging, batch)
                    batch = {}
            if batch:
                self._stage(staging, batch)
            with self.client.pipeline(transaction=True) as pipe:
                if self.client.exists(staging):
                    pipe.rename(staging, self.key)
                    pipe.persist(self.key)  # RENAME carries the staging key's expiry over
                else:
                    pipe.delete(self.key)
                pipe.set(self.written_key, version)
                pipe.execute()
        except BaseException:
            with contextlib.suppress(redis.RedisError):
                self.client.delete(staging)
            raise

    def _stage(self, staging: str, batch: dict[str, str]) -> None:
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(staging, mapping=batch)  # type: ignore[arg-type]
            pipe.expire(staging, STAGING_TTL_S)
            pipe.execute()


class FileCandidateStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def all(self) -> list[Candidate]:
        if not self.path.is_file():
            return []
        with self.path.open(encoding="utf-8") as f:
            return [from_json(line) for line in f if line.strip()]

    def count(self) -> int:
        return len(self.all())

    @property
    def _marker(self) -> Path:
        return self.path.with_suffix(".version")

    def version(self) -> str | None:
        try:
            return self._marker.read_text().strip() or None
        except FileNotFoundError:
            return None

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self._marker.unlink(missing_ok=True)

    def replace(self, candidates: Iterable[Candidate], version: str) -> None:
        """The records, then the version they are: a crash between leaves a marker that names another
        version than the pointer, so a reader goes to the version's own records."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._marker.unlink(missing_ok=True)
        with atomic_file(self.path, "w", sync_dir=True) as f:
            for c in sorted(candidates, key=lambda c: c.key):
                f.write(to_json(c) + "\n")
        with atomic_file(self._marker, "w", sync_dir=True) as f:
            f.write(version + "\n")


def apply(current: list[Candidate], mode: str, upload: list[Candidate]) -> list[Candidate]:
    """The candidate set after an upload. Records are keyed by id; a later
    record with the same id replaces an earlier one."""
    if mode == "replace":
        return list({c.key: c for c in upload}.values())
    if mode == "reencode":  # the same records under another encoder
        return list(current)
    by_id = {c.key: c for c in current}
    if mode == "append":
        by_id.update({c.key: c for c in upload})
    elif mode == "delete":
        for c in upload:
            by_id.pop(c.key, None)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return list(by_id.values())


def duplicates(
    current: Sequence[Candidate],
    mode: str,
    upload: Sequence[Candidate],
    merged: Sequence[Candidate],
    lines: Sequence[int] | None = None,
) -> dict[str, Any]:
    """What `apply` and the index build (index.build.tables: one row per normalised reply, the first
    in `merged` order) did with the upload's duplicates, for the job report: per rule, how many upload
    records and the first of their lines (positions when `lines` is None). Each record counts once, for
    its id before its text: re-uploading a stored record is one replacement, not also a repeated text."""
    stored = {c.key for c in current} if mode == "append" else set()
    last = {c.key: i for i, c in enumerate(upload)}
    indexed_as: dict[str, str] = {}  # normalised reply -> the id its index row has
    for c in merged:
        if c.kind != "reaction":  # reactions are kept one per id, whatever their text
            indexed_as.setdefault(normalize(c.reply), c.key)
    found: dict[str, list[int]] = {name: [] for name in DUPLICATE_RULES}
    for i, c in enumerate(upload):
        winner = indexed_as.get(normalize(c.reply), c.key) if c.kind != "reaction" else c.key
        if last[c.key] != i:
            found["ids"].append(i)
        elif c.key in stored:
            found["stored_ids"].append(i)
        elif winner != c.key:
            # A stored id comes first in `merged` whatever the upload's order; a new one by first upload.
            found["stored_texts" if winner in stored else "texts"].append(i)
    line_of = (lambda i: lines[i]) if lines is not None else (lambda i: i + 1)
    return {
        name: {"records": len(found[name]), "lines": [line_of(i) for i in found[name][:REPORTED_LINES]], "rule": rule}
        for name, rule in DUPLICATE_RULES.items()
    }
