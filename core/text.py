"""Text normalisation shared by the index build, the caches and the sessions,
and the echo check that keeps a user's own words from coming back as a reply.

One function for the key, so a cache key computed at serving time matches the
key the index build deduplicated on.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Sequence

_WHITESPACE = re.compile(r"\s+")
_WORDS = re.compile(r"\w+")

# Near-copy bars, set between the cases in tests/test_text.py: "i'm from utah,
# you?" against "I am from Utah. You?" (words 0.67, trigrams 0.72) is a copy;
# "do you like dogs?" against "do you like cats?" (0.60, 0.56) is not.
MIN_WORDS_FOR_FUZZY = 3  # "hi" and "hi there" are different replies; only identical short lines are copies
WORD_JACCARD = 0.65
TRIGRAM_JACCARD = 0.7


# Hangul compatibility jamo and their halfwidth forms are words of their own in
# Korean chat ("ㅋㅋ", "ㅠㅠ", "ㅇㅋ"). NFKC maps them to conjoining jamo, which then
# compose into syllables that were never typed: "ㅋㅠㅠ" -> "큐ᅲ".
_KEPT_JAMO = re.compile("([\u3130-\u318f\uffa0-\uffdc]+)")


def normalize(text: str, lowercase: bool = True) -> str:
    """NFKC, lower case, whitespace collapsed: 'Hi  there!' -> 'hi there!'.

    NFKC folds full-width letters and ligatures, and composes conjoining
    Hangul jamo into syllables, so the same Korean word typed on two keyboards
    gets one key. Runs of compatibility jamo ("ㅋㅋ") are left as typed.
    `lowercase=False` keeps the case, for keys of a cased model's inputs."""
    if text.isascii():  # NFKC leaves ASCII as it is and it holds no jamo: most chat, at a third of the cost
        return _WHITESPACE.sub(" ", text.lower() if lowercase else text).strip()
    runs = _KEPT_JAMO.split(text)  # odd positions: the jamo runs
    text = "".join(run if i % 2 else unicodedata.normalize("NFKC", run) for i, run in enumerate(runs))
    return _WHITESPACE.sub(" ", text.lower() if lowercase else text).strip()


class Signature:
    """What the echo check compares: the words, and character trigrams for typos.

    The retriever checks every hit it returns against every turn, so the sets
    are built once per text, the trigrams only when a check gets that far.
    (Cached by hand: functools.cached_property takes a lock on every first
    use in Python 3.11, a tenth of a check's cost.)"""

    __slots__ = ("_trigrams", "_word_set", "words")

    def __init__(self, words: tuple[str, ...]) -> None:
        self.words = words
        self._word_set: frozenset[str] | None = None
        self._trigrams: frozenset[str] | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Signature) and self.words == other.words

    def __hash__(self) -> int:
        return hash(self.words)

    def __repr__(self) -> str:
        return f"Signature({self.words!r})"

    @classmethod
    def of(cls, text: str) -> Signature:
        return cls.of_normalized(normalize(text))

    @classmethod
    def of_normalized(cls, normalized: str) -> Signature:
        """`of` for a text already through `normalize`: the echo check has it at hand."""
        return cls(tuple(_WORDS.findall(normalized)))

    @property
    def word_set(self) -> frozenset[str]:
        if self._word_set is None:
            self._word_set = frozenset(self.words)
        return self._word_set

    @property
    def trigrams(self) -> frozenset[str]:
        if self._trigrams is None:
            joined = " ".join(self.words)
            # The three shifted copies end together at the last trigram: strict=False is the point.
            self._trigrams = frozenset(map("".join, zip(joined, joined[1:], joined[2:], strict=False)))
        return self._trigrams

    @property
    def most_trigrams(self) -> int:
        """An upper bound on len(trigrams), without building them: one per position."""
        return max(0, sum(map(len, self.words)) + len(self.words) - 3)


def _jaccard(a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> float:
    if not a and not b:
        return 1.0
    shared = len(a & b)
    return shared / (len(a) + len(b) - shared)  # the union's size, without building it


def _similar(a: frozenset[str], b: frozenset[str], at_least: float) -> bool:
    """_jaccard(a, b) >= at_least, skipping the set work when the sizes already rule it out:
    the overlap is at most the smaller set and the union at least the larger."""
    small, large = sorted((len(a), len(b)))
    if large and small < at_least * large:
        return False
    return _jaccard(a, b) >= at_least


def near_copy(a: Signature, b: Signature) -> bool:
    """The same line up to case, punctuation, a word or two, or a typo."""
    if a.words == b.words:
        return True
    if min(len(a.words), len(b.words)) < MIN_WORDS_FOR_FUZZY:
        return False
    if _similar(a.word_set, b.word_set, WORD_JACCARD):
        return True
    # `a` is the candidate, whose trigrams are built per hit; a turn's are built once a request.
    if a.most_trigrams < TRIGRAM_JACCARD * len(b.trigrams):
        return False  # too short to share enough trigrams: the size check of `_similar`, from a bound
    return _similar(a.trigrams, b.trigrams, TRIGRAM_JACCARD)


# The writing system each reaction language is written in. Scripts, not
# languages, are what a character tells apart: a Latin-script reaction set
# answers any Latin-script conversation (English, Spanish, ...).
SCRIPT_OF_LANGUAGE = {
    "en": "Latin",
    "es": "Latin",
    "fr": "Latin",
    "de": "Latin",
    "it": "Latin",
    "pt": "Latin",
    "nl": "Latin",
    "ko": "Hangul",
    "ja": "Japanese",
    "zh": "Han",
    "ru": "Cyrillic",
    "uk": "Cyrillic",
    "ar": "Arabic",
    "he": "Hebrew",
    "th": "Thai",
    "hi": "Devanagari",
    "el": "Greek",
}
_SCRIPT_RANGES = (
    ("Hangul", ((0xAC00, 0xD7A3), (0x1100, 0x11FF), (0x3130, 0x318F), (0xFFA0, 0xFFDC))),
    ("Japanese", ((0x3040, 0x30FF),)),  # kana: with it, Han characters are Japanese too
    ("Han", ((0x4E00, 0x9FFF), (0x3400, 0x4DBF))),
    ("Cyrillic", ((0x0400, 0x04FF),)),
    ("Arabic", ((0x0600, 0x06FF),)),
    ("Hebrew", ((0x0590, 0x05FF),)),
    ("Thai", ((0x0E00, 0x0E7F),)),
    ("Devanagari", ((0x0900, 0x097F),)),
    ("Greek", ((0x0370, 0x03FF),)),
)


_ASCII_LETTERS = string.ascii_letters.encode("ascii")  # what str.isalpha() is true of, in ASCII


def script_of(texts: list[str]) -> str | None:
    """The writing system most letters of these texts are in, or None without letters."""
    counts: dict[str, int] = {}
    for text in texts:
        if text.isascii():  # the common case, counted in C: the length less the text without its letters
            letters = len(text) - len(text.encode("ascii").translate(None, _ASCII_LETTERS))
            if letters:
                counts["Latin"] = counts.get("Latin", 0) + letters
            continue
        for c in text:
            if not c.isalpha():
                continue
            code = ord(c)
            script = next(
                (name for name, ranges in _SCRIPT_RANGES if any(lo <= code <= hi for lo, hi in ranges)),
                "Latin" if code < 0x0250 or 0x1E00 <= code <= 0x1EFF else "Other",
            )
            counts[script] = counts.get(script, 0) + 1
    if not counts:
        return None
    if "Japanese" in counts:  # kanji with kana is Japanese, not Chinese
        counts["Japanese"] += counts.pop("Han", 0)
    return max(counts, key=lambda name: counts[name])


def echoes(candidate: str, turns: Sequence[Signature], normalized: bool = False) -> bool:
    """Whether a candidate reply is a near copy of any of these conversation turns.

    normalized: `candidate` has been through `normalize` already."""
    signature = Signature.of_normalized(candidate if normalized else normalize(candidate))
    return any(near_copy(signature, turn) for turn in turns)
