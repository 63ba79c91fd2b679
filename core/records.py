"""A candidate record: a reply, the query it answered, an id and metadata,
and its one JSON form (the candidate store and every index version use it)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from core.text import normalize


@dataclass(frozen=True, slots=True)  # slots: a reindex holds ~100k of them, ~200 bytes less each
class Candidate:
    reply: str
    query: str | None = None  # the utterance this reply answered, for query similarity
    id: str | None = None  # caller-chosen id; a hash of the normalised pair when not given
    metadata: dict[str, object] | None = None  # kept with the record, not in the index
    # A reaction ("haha", "ㅋㅋㅋ") is not a reply to match: it answers, in its
    # language's conversations, when no retrieved reply is sure enough.
    kind: str = "reply"  # "reply" or "reaction"
    language: str | None = None  # BCP 47; required for a reaction
    # Request-time filters select on these (`core.filters`); stored with the version.
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # The key is asked for several times a record in a reindex (merge, duplicates, build): a
        # hash of the normalised pair each time was 5 s of a 100k-candidate reindex. Kept once.
        if not self.id:  # None, or "" (as before: an empty id was never a key)
            object.__setattr__(self, "id", candidate_id(self.reply, self.query))

    @property
    def key(self) -> str:
        assert self.id is not None  # __post_init__ set it
        return self.id


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
    if c.tags:
        body["tags"] = list(c.tags)
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
        tags=tuple(body.get("tags", ())),
    )
