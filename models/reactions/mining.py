"""Reaction keys: a reply folded so that the ways of writing one reaction share a key ("Hahaha!!",
"haha"), and a bundle's reaction labels as the classes replies are sorted into by that key.

Mining the corpus's frequent short replies (`mine`) stays for the eval's reaction tables; the
head's classes (models/reactions/classes.py) do not come from it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from core.text import normalize

_PUNCTUATION = re.compile(r"[^\w\s']+")
_LONG_RUNS = re.compile(r"(\w)\1{2,}")  # "sooooo" -> "soo"
_LAUGHTER = re.compile(r"\b(ha|he|lo)(?:\1)+[hl]?\b")  # "hahahah" -> "haha", "lolol" -> "lol"
_ANY_RUN = re.compile(r"(\w)\1+")


def reaction_key(text: str) -> str:
    """Case, punctuation, apostrophes, stretched letters and laughter length
    removed: "Hahahaha!!" and "haha" share a key, as do "that's" and "thats"."""
    key = _PUNCTUATION.sub(" ", normalize(text).replace("\u2019", "'"))
    key = _LONG_RUNS.sub(r"\1\1", key)
    key = _LAUGHTER.sub(lambda m: "lol" if m.group(1) == "lo" else m.group(1) * 2, key)
    return " ".join(key.replace("'", "").split())


def near_duplicate_key(key: str) -> str:
    """Doubled letters collapsed too, merging "yess"/"yes" and "ohh"/"oh"."""
    return _ANY_RUN.sub(r"\1", key)


@dataclass(frozen=True)
class MiningConfig:
    max_words: int = 3  # a reaction, not an answer: "oh no", "me too", "what about you"
    max_chars: int = 24
    # A class must be at least 1 in 5,000 train replies: below that a class
    # adds under 0.02% coverage and has too few examples to learn from.
    min_share: float = 2e-4
    min_examples: int = 2  # the floor for tiny corpora


@dataclass(frozen=True)
class ReactionKeys:
    labels: list[str]  # [C] the surface form served for each class
    merge_keys: list[str]  # [C]
    coverage: float  # share of the replies that fall in a class

    @classmethod
    def from_labels(cls, labels: Sequence[str]) -> ReactionKeys:
        """Rebuilt from a bundle's labels: each label is a member of its own class."""
        return cls(list(labels), [near_duplicate_key(reaction_key(label)) for label in labels], float("nan"))

    def classify(self, replies: Sequence[str]) -> np.ndarray:
        """[N] class index per reply, -1 where it is not a reaction."""
        index = {k: i for i, k in enumerate(self.merge_keys)}
        return np.array([index.get(near_duplicate_key(reaction_key(r)), -1) for r in replies], dtype=np.int64)


def mine(replies: Sequence[str], config: MiningConfig = MiningConfig()) -> ReactionKeys:
    """Frequent short replies, near-duplicates merged; the number of classes
    follows from the coverage floor in `config`, not from a fixed count."""
    counts: Counter[str] = Counter()
    surfaces: dict[str, Counter[str]] = {}
    for reply in replies:
        key = reaction_key(reply)
        if not key or len(key.split()) > config.max_words or len(key) > config.max_chars:
            continue
        merged = near_duplicate_key(key)
        counts[merged] += 1
        surfaces.setdefault(merged, Counter())[normalize(reply)] += 1
    floor = max(config.min_examples, math.ceil(config.min_share * len(replies)))
    kept = [(k, n) for k, n in counts.most_common() if n >= floor]
    labels = [surfaces[k].most_common(1)[0][0] for k, _ in kept]
    coverage = sum(n for _, n in kept) / max(1, len(replies))
    return ReactionKeys(labels, [k for k, _ in kept], round(coverage, 4))
