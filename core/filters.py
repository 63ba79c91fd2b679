"""Request-time filters: which stored replies (and reactions) a request may be answered with.

A filter compiles, once per index version (`IndexVersion.memo`), into the
rows each index admits, and a top k comes back from the admitted rows alone,
never cut from an unfiltered one after the fact. Few admitted rows are
copied into a flat index of their own and scanned exactly (`exact_subset`,
kept for the last SUBSETS_KEPT filters); many are searched in the graph or
the inverted file with a bitmap FAISS tests as it goes (`ann.search`).
Stored queries are admitted by the reply they are paired with. Tags and
languages are the records' own (`core.records.Candidate`); ids are the ones
`/reply` returns.

Only a rule's tags and language compile (`Filter.compiled`): they are what
a request shares with other clients' requests. Its `exclude_ids` are
dropped after the search, as the session's recent replies are
(`retriever.Avoid`): up to 256 ids made up afresh on every request would
otherwise compile and copy a selection each time, and push every other
client's filters out of the few kept.

Tags, likewise, are keyed as the version knows them (`known`): a tag no
stored reply carries excludes nothing under tags_none and matches nothing
under tags_any or tags_all, so fresh made-up tags on every request compile
nothing either, and evict nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import faiss
import numpy as np

from core import ann
from core.store import SUBSETS_KEPT, IndexVersion

Side = Literal["replies", "queries"]


@dataclass(frozen=True)
class Filter:
    tags_any: frozenset[str] = frozenset()  # at least one of these
    tags_all: frozenset[str] = frozenset()  # every one of these
    tags_none: frozenset[str] = frozenset()  # none of these
    language: str | None = None  # written in this language (as uploaded)
    exclude_ids: frozenset[str] = frozenset()  # never these ids

    def __bool__(self) -> bool:
        return bool(self.tags_any or self.tags_all or self.tags_none or self.language or self.exclude_ids)

    @property
    def compiled(self) -> Filter | None:
        """What compiles into admitted rows: the tags and the language, without the ids; None if nothing."""
        base = Filter(self.tags_any, self.tags_all, self.tags_none, self.language)
        return base if base else None

    @property
    def selects_tags(self) -> bool:
        """Whether only tagged candidates can pass: the model's reactions carry no tags."""
        return bool(self.tags_any or self.tags_all)

    def admits(self, id: str, tags: tuple[str, ...] | frozenset[str], language: str | None) -> bool:
        """One candidate, by its own fields: for the few reactions, which are not index rows."""
        own = set(tags)
        return (
            id not in self.exclude_ids
            and (not self.tags_any or bool(own & self.tags_any))
            and self.tags_all <= own
            and not own & self.tags_none
            and (self.language is None or language == self.language)
        )


@dataclass(frozen=True)
class Selection:
    """The rows of one index that a filter admits."""

    mask: np.ndarray  # [N] bool

    @cached_property
    def count(self) -> int:
        return int(self.mask.sum())

    @cached_property
    def bitmap(self) -> np.ndarray:
        """[ceil(N / 8)] uint8, row i at bit i % 8 of byte i // 8: the layout of faiss.IDSelectorBitmap."""
        return np.packbits(self.mask, bitorder="little")

    def selector(self) -> faiss.IDSelector:
        """A FAISS selector over `bitmap`. It points into the array without a copy, so this
        Selection must outlive every search that uses it (it does: the caller holds it)."""
        return faiss.IDSelectorBitmap(len(self.bitmap), faiss.swig_ptr(self.bitmap))

    def admits(self, row: int) -> bool:
        return bool(self.mask[row])


@dataclass(frozen=True)
class Admitted:
    """A filter compiled against one version."""

    rule: Filter
    replies: Selection  # [R]
    queries: Selection  # [Q], by the reply each stored query is paired with

    def of(self, side: Side) -> Selection:
        return self.replies if side == "replies" else self.queries


def known(index: IndexVersion, rule: Filter) -> Filter | None:
    """`rule`'s tags and language as `index` knows them, what a filter is keyed by; an empty Filter
    when they restrict nothing here, None when they admit no reply of it. A tag no stored reply
    carries excludes nothing (tags_none) and matches nothing (tags_any, tags_all); so does a
    language none was uploaded with. Uploaded reactions are not index rows: `Filter.admits` holds
    them to the whole rule, unknown tags and all."""
    tags = index.reply_tag_rows
    tags_any = frozenset(t for t in rule.tags_any if t in tags)
    if (rule.tags_any and not tags_any) or not rule.tags_all <= tags.keys():
        return None
    if rule.language is not None and rule.language not in index.reply_language_rows:
        return None
    return Filter(tags_any, rule.tags_all, frozenset(t for t in rule.tags_none if t in tags), rule.language)


def admitted(index: IndexVersion, rule: Filter) -> Admitted | None:
    """The rows `rule`'s tags and language admit in `index`, computed once per version and filter
    as `known` keys it; None when they restrict nothing (its ids, if any, are dropped after the
    search). A rule that admits no reply here gets an empty selection, made on the spot: it
    neither compiles nor takes a place among the filters kept."""
    base = rule.compiled
    if base is None:
        return None
    key = known(index, base)
    if key is None:
        return _nothing(index, base)
    if not key:
        return None
    return index.memo.get(("filter", key), lambda: _compile(index, key))  # type: ignore[no-any-return]


def _nothing(index: IndexVersion, rule: Filter) -> Admitted:
    none = Selection(np.zeros(len(index.reply_ids), dtype=bool))
    return Admitted(rule, none, Selection(np.zeros(len(index.query_reply_rows), dtype=bool)))


def _compile(index: IndexVersion, rule: Filter) -> Admitted:
    total = len(index.reply_ids)
    empty = np.empty(0, dtype=np.int64)
    if rule.tags_any:
        mask = np.zeros(total, dtype=bool)  # [R]
        for tag in rule.tags_any:
            mask[index.reply_tag_rows.get(tag, empty)] = True
    else:
        mask = np.ones(total, dtype=bool)
    for tag in rule.tags_all:
        keep = np.zeros(total, dtype=bool)
        keep[index.reply_tag_rows.get(tag, empty)] = True
        mask &= keep
    for tag in rule.tags_none:
        mask[index.reply_tag_rows.get(tag, empty)] = False
    if rule.language is not None:
        keep = np.zeros(total, dtype=bool)
        keep[index.reply_language_rows.get(rule.language, empty)] = True
        mask &= keep
    return Admitted(rule, Selection(mask), Selection(mask[index.query_reply_rows]))


def exact_subset(index: IndexVersion, only: Admitted, side: Side) -> ann.Subset | None:
    """The admitted rows of one side copied into a flat index, for an exact scan that reads only
    them; None when they are too many for that to pay (the graph or inverted file searches them).
    Built on first use and kept for the last few filters (`IndexVersion.subsets`)."""
    selection = only.of(side)
    if not 0 < selection.count < ann.FILTERED_EXACT_BELOW:
        return None
    whole = index.reply_index if side == "replies" else index.query_index
    build = lambda: ann.subset(whole, np.flatnonzero(selection.mask))  # noqa: E731
    return index.subsets.get((only.rule, side), build)  # type: ignore[no-any-return]


def search(
    index: IndexVersion, side: Side, queries: np.ndarray, k: int, only: Admitted | None = None, narrow: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """queries [Q, D] -> (scores [Q, k], rows [Q, k] of the side's index, -1 past the last hit),
    among the rows `only` admits: as `/reply` searches, and as bench/filters.py measures it.
    `narrow`: only the top hit matters, and only if it is a near copy (`ann.narrow_search`);
    a filtered search is never narrowed."""
    whole = index.reply_index if side == "replies" else index.query_index
    if only is None:
        return ann.narrow_search(whole, queries, k) if narrow else ann.search(whole, queries, k)
    selection = only.of(side)
    if selection.count == 0:  # nothing to search: no bitmap to pack, no selector to build
        return np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64)
    subset = exact_subset(index, only, side)
    if subset is not None:
        return subset.search(queries, k)
    return ann.search(whole, queries, k, selection.selector(), selection.count)


def warm(index: IndexVersion, like: IndexVersion) -> int:
    """Compiles on `index` the filters most recently used on `like` (the version it replaces), and
    builds their copies, so that a reindex or a rollback does not make the next request of each
    filter pay for them (67 ms at 10% of 96k rows). Off the request path: where a version is loaded.
    Returns how many filters it warmed."""
    rules = [key[1] for key in like.memo.kept() if isinstance(key, tuple) and key[0] == "filter"]
    recent = rules[-SUBSETS_KEPT:]
    for rule in recent:
        only = admitted(index, rule)
        for side in ("replies", "queries"):
            if only is not None:
                exact_subset(index, only, side)
    return len(recent)
