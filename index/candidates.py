"""The candidate store: the source of truth a reindex builds from.

Redis when configured (one hash, id -> record), otherwise a JSON-lines file
on the artifact volume. Both replace their whole content atomically (RENAME,
os.replace), so a reader never sees half an upload.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import redis

from index.build import Candidate

REDIS_KEY = "candidates"
WRITTEN_KEY = "candidates:written"  # set once the store has been written, even if empty since
CHUNK = 5000  # records per Redis round trip


def to_json(c: Candidate) -> str:
    body: dict[str, object] = {"id": c.key, "reply": c.reply}
    if c.query:
        body["query"] = c.query
    if c.metadata:
        body["metadata"] = c.metadata
    return json.dumps(body, ensure_ascii=False)


def from_json(raw: str | bytes) -> Candidate:
    body = json.loads(raw)
    return Candidate(reply=body["reply"], query=body.get("query"), id=body["id"], metadata=body.get("metadata"))


class CandidateStore(Protocol):
    def all(self) -> list[Candidate]: ...
    def count(self) -> int: ...
    def written(self) -> bool: ...
    def replace(self, candidates: Iterable[Candidate]) -> None: ...


class RedisCandidateStore:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def all(self) -> list[Candidate]:
        records = [from_json(v) for _, v in self.client.hscan_iter(REDIS_KEY, count=CHUNK)]
        return sorted(records, key=lambda c: c.key)  # a stable order: stable index rows

    def count(self) -> int:
        return int(self.client.hlen(REDIS_KEY))

    def written(self) -> bool:
        return bool(self.client.exists(WRITTEN_KEY))

    def replace(self, candidates: Iterable[Candidate]) -> None:
        """Written under a temporary key, then renamed over the live one."""
        staging = f"{REDIS_KEY}:staging:{os.getpid()}"
        self.client.delete(staging)
        batch: dict[str, str] = {}
        for c in candidates:
            batch[c.key] = to_json(c)
            if len(batch) >= CHUNK:
                self.client.hset(staging, mapping=batch)  # type: ignore[arg-type]
                batch = {}
        if batch:
            self.client.hset(staging, mapping=batch)  # type: ignore[arg-type]
        with self.client.pipeline(transaction=True) as pipe:
            if self.client.exists(staging):
                pipe.rename(staging, REDIS_KEY)
            else:
                pipe.delete(REDIS_KEY)
            pipe.set(WRITTEN_KEY, 1)
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

    def written(self) -> bool:
        return self.path.is_file()

    def replace(self, candidates: Iterable[Candidate]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        with tmp.open("w", encoding="utf-8") as f:
            for c in sorted(candidates, key=lambda c: c.key):
                f.write(to_json(c) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def apply(current: list[Candidate], mode: str, upload: list[Candidate]) -> list[Candidate]:
    """The candidate set after an upload. Records are keyed by id; a later
    record with the same id replaces an earlier one."""
    if mode == "replace":
        return list({c.key: c for c in upload}.values())
    by_id = {c.key: c for c in current}
    if mode == "append":
        by_id.update({c.key: c for c in upload})
    elif mode == "delete":
        for c in upload:
            by_id.pop(c.key, None)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return list(by_id.values())


def seed_from_index(index_dir: Path) -> list[Candidate]:
    """The serving version's candidates, for a store that has never been written:
    appending to an empty store must not drop what is being served."""
    body = json.loads((index_dir / "candidates.json").read_text())
    records = []
    with_query = set()
    for query, row in zip(body["query_texts"], body["query_reply_rows"], strict=True):
        records.append(Candidate(reply=body["reply_texts"][row], query=query))
        with_query.add(row)
    for row, (rid, reply) in enumerate(zip(body["reply_ids"], body["reply_texts"], strict=True)):
        if row not in with_query:
            records.append(Candidate(reply=reply, id=rid))
    return records
