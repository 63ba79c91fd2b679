"""Chitchat corpus -> turns -> (context, reply) pairs, split by conversation id; and the Korean
conversations the default candidate set serves beside it (index/data/README.md).

Pure Python on purpose: `index/` builds from these pairs without touching torch.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from core.text import normalize

Split = Literal["train", "validation", "test"]

# Bucket boundaries out of 100 for the conversation-id hash: 80 / 10 / 10.
_TRAIN_BUCKETS = 80
_VALIDATION_BUCKETS = 90

# Candidates longer than this are essays, not chit-chat replies, and cost the
# most to embed; ~3.5% of chitchat turns are dropped by it.
MAX_CANDIDATE_CHARS = 280


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: tuple[str, ...]  # consecutive messages of one sender, joined with a space


@dataclass(frozen=True)
class Pair:
    conversation_id: str
    context: tuple[str, ...]  # the previous turns, oldest first; context[-1] is the query
    reply: str

    @property
    def query(self) -> str:
        return self.context[-1]


def split_of(conversation_id: str) -> Split:
    """A fixed hash of the id, so a conversation never crosses splits and the
    split does not change when the corpus order or Python's hash seed does."""
    bucket = int(hashlib.sha1(conversation_id.encode()).hexdigest(), 16) % 100
    if bucket < _TRAIN_BUCKETS:
        return "train"
    if bucket < _VALIDATION_BUCKETS:
        return "validation"
    return "test"


def corpus_path() -> Path:
    import chitchat_dataset  # offline data package; imported lazily so tests can pass their own file

    return Path(chitchat_dataset.__file__).parent / "dataset.json"


def load_conversations(path: Path | None = None) -> list[Conversation]:
    """Read the BYU chitchat JSON: {id: {"messages": [[{text, sender}, ...], ...]}}.

    The corpus already groups messages by sender, but groups from the same
    sender are merged again here so the turn definition does not depend on it.
    """
    raw = json.loads((path or corpus_path()).read_text())
    conversations = []
    for conversation_id, body in raw.items():
        turns: list[str] = []
        last_sender = None
        for group in body.get("messages", []):
            texts = [m["text"].strip() for m in group if m.get("text", "").strip()]
            if not texts:
                continue
            sender = group[0].get("sender")
            text = " ".join(texts)
            if turns and sender == last_sender:
                turns[-1] = f"{turns[-1]} {text}"
            else:
                turns.append(text)
            last_sender = sender
        if len(turns) >= 2:
            conversations.append(Conversation(conversation_id, tuple(turns)))
    return conversations


# Korean chat the default set serves beside chitchat's English (index/data/README.md says where it
# comes from): every conversation, no split, as the English train split's are all served.
KOREAN_CONVERSATIONS = Path(__file__).resolve().parent / "data" / "korean_conversations.jsonl.gz"


def load_korean_conversations(path: Path = KOREAN_CONVERSATIONS) -> list[Conversation]:
    """{"id": ..., "turns": [...]} per line, gzipped; each turn is one speaker's, alternating."""
    conversations = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            body = json.loads(line)
            turns = tuple(t.strip() for t in body["turns"] if t.strip())
            if len(turns) >= 2:
                conversations.append(Conversation(body["id"], turns))
    return conversations


def pairs_from(conversations: Iterable[Conversation], max_context_turns: int) -> Iterator[Pair]:
    for conv in conversations:
        for i in range(1, len(conv.turns)):
            context = conv.turns[max(0, i - max_context_turns) : i]
            yield Pair(conv.id, context, conv.turns[i])


def split_summary(path: Path | None = None) -> dict[str, object]:
    """What a bundle was trained on: the corpus, the split rule, and a hash of
    every conversation's split, which changes if the corpus or the rule does."""
    conversations = load_conversations(path)
    assignment = sorted(f"{c.id}:{split_of(c.id)}" for c in conversations)
    counts = Counter(split_of(c.id) for c in conversations)
    return {
        "corpus": "chitchat-dataset (BYU chit-chat challenge), " + (str(path) if path else "dataset.json"),
        "split_rule": f"sha1(conversation id) % 100: <{_TRAIN_BUCKETS} train, <{_VALIDATION_BUCKETS} validation, test",
        "split_sha256": hashlib.sha256("\n".join(assignment).encode()).hexdigest(),
        "conversations": dict(sorted(counts.items())),
    }


def load_pairs(split: Split, max_context_turns: int, path: Path | None = None) -> list[Pair]:
    conversations = [c for c in load_conversations(path) if split_of(c.id) == split]
    return list(pairs_from(conversations, max_context_turns))


@dataclass(frozen=True)
class CandidateRecord:
    """One stored reply and the query it answered, if any."""

    reply: str
    query: str | None = None


def candidate_records(pairs: Iterable[Pair]) -> list[CandidateRecord]:
    """Query/reply pairs for the index.

    For each distinct normalised query only its most frequent reply is kept
    (first seen wins a tie), so the query index holds one row per query and a
    frequent opener like "hi" points at its most typical answer. Replies that
    lost every tie are still kept, without a query, for reply matching.
    """
    by_query: dict[str, Counter[str]] = {}
    reply_keys: dict[str, None] = {}  # an ordered set
    surface: dict[str, str] = {}  # normalised -> first surface form seen
    for pair in pairs:
        if not 0 < len(pair.reply) <= MAX_CANDIDATE_CHARS:
            continue
        reply_key = normalize(pair.reply)
        surface.setdefault(reply_key, pair.reply)
        reply_keys[reply_key] = None
        if len(pair.query) <= MAX_CANDIDATE_CHARS:
            query_key = normalize(pair.query)
            surface.setdefault(query_key, pair.query)
            by_query.setdefault(query_key, Counter())[reply_key] += 1
    records = []
    for query_key, replies in by_query.items():
        reply_key = replies.most_common(1)[0][0]
        records.append(CandidateRecord(reply=surface[reply_key], query=surface[query_key]))
    paired = {normalize(r.reply) for r in records}
    records.extend(CandidateRecord(reply=surface[k]) for k in reply_keys if k not in paired)
    return records
