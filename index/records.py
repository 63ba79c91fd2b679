"""A candidate record: a reply, the query it answered, an id and metadata,
and its one JSON form (the candidate store and every index version use it)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from app.core.text import normalize


@dataclass(frozen=True, slots=True)  # slots: a reindex holds ~100k of them, ~200 bytes less each
class Candidate:
    reply: str
    query: str | None = None  # the utterance this reply answered, for query similarity
    id: str | None = None  # caller-chosen id; defaults to a hash of the normalised pair
    metadata: dict[str, object] | None = None  # kept with the record, not in the index
    # A reaction ("haha", "ㅋㅋㅋ") is not a reply to match: it answers, in its
    # language's conversations, when no retrieved reply is sure enough.
    kind: str = "reply"  # "reply" or "reaction"
    language: str | None = None  # BCP 47; required for a reaction

    @property
    def key(self) -> str:
        return self.id or candidate_id(self.reply, self.query)


def candidate_id(reply: str, query: str | None = None) -> str:
    """Stable id of a (query, reply) record: the same pair uploaded twice is one record."""
    text = normalize(reply) if query is None else f"{normalize(query)}\x1f{normalize(reply)}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def to_json(c: Candidate) -> str:
    body: dict[str, object] = {"id": c.key, "reply": c.reply}
    if c.query:
        body["query"] = c.query
    if c.metadata:
        body["metadata"] = c.metadata
    if c.kind != "reply":
        body["kind"] = c.kind
    if c.language:
        body["language"] = c.language
    return json.dumps(body, ensure_ascii=False)


def from_json(raw: str | bytes) -> Candidate:
    body = json.loads(raw)
    return Candidate(
        reply=body["reply"],
        query=body.get("query"),
        id=body["id"],
        metadata=body.get("metadata"),
        kind=body.get("kind", "reply"),
        language=body.get("language"),
    )
