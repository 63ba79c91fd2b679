"""A first slice of the default candidates: what `make run` serves within a minute on a fresh
clone while the service builds the rest (app/reindex/first_build.py).

The slice is the replies that answer the most distinct contexts in the corpus: the ones the full
index would serve most often, so the first answers are the ones people would mostly get anyway.
The default set holds two languages, and a turn is answered from its own language's replies, so
each language gets its share of the slice: in proportion to its replies, but at least a fifth (300
of the 1,500 for Korean's ~4k replies beside ~97k English), so a Korean first message is answered
in Korean too. Each reply brings at most one stored query (query similarity is off unless a
request asks), and every reaction comes along. A marker file beside the pointer says the full
build is still owed; the service removes it once the full version serves.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from core.files import write_json_atomic
from core.records import Candidate
from core.text import normalize

MARKER = "FIRST_SLICE"
# Replies in the slice: ~2,000 texts to encode with their queries, 10-30 s on 2 cores with or
# without VNNI for the 12-layer default, so the first answer comes within the minute.
SLICE_REPLIES = 1500


@dataclass(frozen=True)
class Owed:
    """What the marker records: the full build the slice stands in for."""

    bundle_checksum: str
    slice_version: str
    source: str  # what the full build indexes (`index.build.DEFAULT_SOURCE`)
    replies: int  # distinct replies in the full candidate set
    max_context_turns: int
    corpus: str | None = None  # the corpus file the full build reads; None: the chitchat package's
    korean: bool = True  # whether the full build adds the shipped Korean conversations (`--no-korean`: not)


# The least share of the slice a language of the candidates gets, however few its replies.
MIN_LANGUAGE_SHARE = 0.2


def first_slice(candidates: Sequence[Candidate], replies: int = SLICE_REPLIES) -> list[Candidate]:
    """The records of the `replies` replies with the most distinct stored queries, one query each, and
    every reaction; the replies shared among the candidates' languages (`language_quotas`). Ties keep
    the corpus order, so the slice is a function of the candidates."""
    contexts: dict[str, set[str]] = {}
    first: dict[str, Candidate] = {}
    for c in candidates:
        if c.kind == "reaction":
            continue
        key = normalize(c.reply)
        first.setdefault(key, c)
        if c.query:
            contexts.setdefault(key, set()).add(normalize(c.query))
    by_language: dict[str | None, Counter[str]] = {}
    for key, c in first.items():
        by_language.setdefault(c.language, Counter())[key] = len(contexts.get(key, ()))
    quotas = language_quotas({language: len(keys) for language, keys in by_language.items()}, replies)
    chosen = [first[key] for language, counts in by_language.items() for key, _ in counts.most_common(quotas[language])]
    return chosen + [c for c in candidates if c.kind == "reaction"]


def language_quotas(sizes: dict[str | None, int], replies: int) -> dict[str | None, int]:
    """How many of `replies` each language's distinct replies (`sizes`) get: in proportion, but at least
    MIN_LANGUAGE_SHARE of them each, never more than it has; the language with the most replies takes
    what the others leave. One language (or none: candidates without one) gets all `replies`."""
    if not sizes:
        return {}
    floor = int(replies * MIN_LANGUAGE_SHARE)
    total = sum(sizes.values())
    quotas = {language: min(n, max(floor, round(replies * n / total))) for language, n in sizes.items()}
    largest = max(sizes, key=lambda language: sizes[language])
    others = sum(q for language, q in quotas.items() if language != largest)
    quotas[largest] = min(sizes[largest], max(0, replies - others))
    return quotas


def owed(indexes: Path) -> Owed | None:
    try:
        return Owed(**json.loads((indexes / MARKER).read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def owe(indexes: Path, debt: Owed) -> None:
    write_json_atomic(indexes / MARKER, asdict(debt), indent=2, sync_dir=True)


def settle(indexes: Path) -> None:
    (indexes / MARKER).unlink(missing_ok=True)
