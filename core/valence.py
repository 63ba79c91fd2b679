"""Good news or bad: a text's valence, and the side it takes only when sure, in numpy.

A logistic model over the text's hashed character and word n-grams, and, where
the model has one, the vector of the reaction model's encoder for it. N-grams
carry what a short Korean turn says about its mood ("잘렸어", "ㅠㅠ", "좋다") in
pieces a sentence vector blurs; the vector carries the rest. Trained offline on
native labels (`models/reactions/valence.py`, docs/reactions.md) and shipped
in the reaction model's bundle as VALENCE_FILE.

Two heads, stacked per script for a user's turn: the n-gram head alone reads
a stored reply, from its text, so an index build scores every reply without
an encoder pass.

A side is taken only past a margin chosen on held-out dev texts, one for each
script (`sure` for a turn, `reply_sure` for a reply): the log-odds are read in
units of it (`turn_lean`), so every caller takes a side at 1. A question is never good news:
"do you like hiking?" asks, it does not tell.
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.bundle import VALENCE_FILE, ValenceSpec, sha256_file

_WORD = re.compile(r"\w+|[^\w\s]")
_PRIME = np.uint64(1_000_003)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the top bits of the product are well mixed
_CHUNK = 4096  # texts hashed together: ~10 MB of intermediate arrays


def _words(flat: str) -> list[str]:
    tokens = _WORD.findall(flat)
    return [f"w{w}" for w in tokens] + [f"b{a} {b}" for a, b in itertools.pairwise(tokens)]


def gram_pairs(texts: Sequence[str], spec: ValenceSpec) -> tuple[np.ndarray, np.ndarray]:
    """Every distinct (text, bucket) of the texts' n-grams: rows [M] int64 (an index of `texts`) and
    buckets [M] int64, sorted by row, then bucket. The n-grams: characters of each order over the
    lowercased text with a space at either end (so a word's first and last letters are grams of
    their own), then, with `spec.words`, its words and word pairs.

    Character grams are hashed in numpy over all the texts at once, one order at a time (a stored
    reply in microseconds; a Python loop over its grams took half a millisecond); words by crc32.
    Both are the same in every process, unlike `hash`."""
    flats = [" ".join(t.lower().split()) for t in texts]
    padded = [f" {f} " for f in flats]
    lengths = np.array([len(p) for p in padded], dtype=np.int64)  # [N]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)  # [N]
    codes = np.frombuffer("".join(padded).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)  # [L]
    owner = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)  # [L] the text each character is of
    rows, buckets = [], []
    with np.errstate(over="ignore"):  # the hash wraps at 64 bits by design
        for n in spec.orders:
            count = len(codes) - n + 1
            if count <= 0:
                continue
            h = np.full(count, n, dtype=np.uint64)  # seeded by the order: "ab" is not "ab " cut short
            for j in range(n):
                h = (h * _PRIME) ^ codes[j : j + count]
            within = np.flatnonzero(
                np.arange(count) + n <= (starts + lengths)[owner[:count]]
            )  # no gram spans two texts
            rows.append(owner[within])
            buckets.append(((h[within] * _MIX) >> np.uint64(64 - spec.bits)).astype(np.int64))
    if spec.words:
        mask = (1 << spec.bits) - 1
        words = [[zlib.crc32(w.encode()) & mask for w in _words(f)] for f in flats]
        rows.append(np.repeat(np.arange(len(texts), dtype=np.int64), [len(w) for w in words]))
        buckets.append(np.array([b for w in words for b in w], dtype=np.int64))
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    keys = np.sort(np.concatenate(rows) << np.int64(spec.bits) | np.concatenate(buckets))  # [M'] by row, bucket
    keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]  # distinct (np.unique hashes: 3x slower)
    return keys >> np.int64(spec.bits), keys & np.int64((1 << spec.bits) - 1)


def gram_ids(text: str, spec: ValenceSpec) -> np.ndarray:
    """[G] int64 the distinct buckets of one text's n-grams, ascending (`gram_pairs`)."""
    return gram_pairs([text], spec)[1]


def is_question(text: str) -> bool:
    return text.rstrip().endswith(("?", "？"))


def has_hangul(text: str) -> bool:
    return any("\uac00" <= ch <= "\ud7a3" for ch in text)


@dataclass(frozen=True)
class Valence:
    spec: ValenceSpec
    grams: np.ndarray  # [2**bits] the n-gram head's weight per bucket (most are 0: pruned)
    gram_bias: float  # the n-gram head's: with `grams`, a stored reply's log-odds
    vector: np.ndarray  # [D] the vector head's weights, over the reaction model's unit vector of a turn
    vector_bias: float
    # [2, 3] a turn's log-odds from the two heads' (n-gram weight, vector weight, bias), for a turn
    # without Hangul (row 0) and with it (row 1): each script leans on the head that reads it better.
    stack: np.ndarray
    digest: str = ""  # sha256 of VALENCE_FILE: which model scored a version's stored replies

    @classmethod
    def load(cls, bundle_dir: Path, spec: ValenceSpec) -> Valence:
        with np.load(bundle_dir / VALENCE_FILE) as saved:
            arrays = {name: saved[name] for name in saved.files}
        return cls.from_arrays(spec, arrays, sha256_file(bundle_dir / VALENCE_FILE))

    @classmethod
    def from_arrays(cls, spec: ValenceSpec, arrays: dict[str, np.ndarray], digest: str = "") -> Valence:
        """VALENCE_FILE's arrays: gram_rows [K] int32 and gram_weights [K] (the weights kept), vector [D],
        gram_bias, vector_bias, stack [2, 3]."""
        rows = arrays["gram_rows"].astype(np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= 1 << spec.bits):
            raise ValueError(f"{VALENCE_FILE}: gram rows outside {1 << spec.bits} buckets")
        grams = np.zeros(1 << spec.bits, np.float32)
        grams[rows] = arrays["gram_weights"].astype(np.float32)
        stack = arrays["stack"].astype(np.float32)
        if stack.shape != (2, 3):
            raise ValueError(f"{VALENCE_FILE}: stack {stack.shape}, not (2, 3)")
        return cls(
            spec,
            grams,
            float(arrays["gram_bias"]),
            arrays["vector"].astype(np.float32),
            float(arrays["vector_bias"]),
            stack,
            digest,
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        """What `from_arrays` reads: only the kept n-gram weights, as float16."""
        rows = np.flatnonzero(self.grams)
        return {
            "gram_rows": rows.astype(np.int32),
            "gram_weights": self.grams[rows].astype(np.float16),
            "gram_bias": np.array(self.gram_bias, np.float32),
            "vector": self.vector.astype(np.float32),
            "vector_bias": np.array(self.vector_bias, np.float32),
            "stack": self.stack.astype(np.float32),
        }

    def gram_log_odds(self, text: str) -> float:
        return float(self.gram_log_odds_all([text])[0])

    def gram_log_odds_all(self, texts: Sequence[str]) -> np.ndarray:
        """[N] the n-gram head's log-odds of each text."""
        rows, buckets = gram_pairs(texts, self.spec)  # [M], [M]
        # Binary features at unit length: a long review and a short turn weigh alike.
        sums = np.bincount(rows, weights=self.grams[buckets], minlength=len(texts))  # [N]
        counts = np.bincount(rows, minlength=len(texts))  # [N]
        return (sums / np.sqrt(np.maximum(counts, 1)) + self.gram_bias).astype(np.float32)

    def turn_log_odds(self, text: str, vector: np.ndarray) -> float:
        """Log-odds that a user's turn is good news. vector: [D] the reaction model's for the turn. A
        question is held at no better than even odds."""
        weights = self.stack[1 if has_hangul(text) else 0]  # [3]
        vector_odds = float(vector @ self.vector) + self.vector_bias
        score = float(weights[0] * self.gram_log_odds(text) + weights[1] * vector_odds + weights[2])
        return min(score, 0.0) if is_question(text) else score

    def turn_lean(self, text: str, vector: np.ndarray) -> float:
        """The turn's log-odds in units of its script's margin: a side is sure at +1 or -1 and past."""
        return self.turn_log_odds(text, vector) / self.spec.sure[1 if has_hangul(text) else 0]

    def turn_side(self, lean: float) -> int:
        """+1 sure good news, -1 sure bad news, 0 not sure, for a `turn_lean`."""
        return int(side(np.array([lean]), 1.0)[0])

    def guarded_side(self, text: str, lean: float) -> int:
        """The side the mood guard holds a turn to: -1 at or below -hold_cheer (no cheerful reply), +1 at
        or above +hold_sympathy (no sympathetic one), else 0; each the script's."""
        script = 1 if has_hangul(text) else 0
        if lean <= -self.spec.hold_cheer[script]:
            return -1
        return 1 if lean >= self.spec.hold_sympathy[script] else 0

    def reply_log_odds(self, texts: Sequence[str]) -> np.ndarray:
        """[N] log-odds that each stored reply is good news, from its text alone (a question: at most even)."""
        scores = np.concatenate(
            [self.gram_log_odds_all(texts[i : i + _CHUNK]) for i in range(0, len(texts), _CHUNK)] or [np.zeros(0)]
        ).astype(np.float32)  # [N]
        asks = np.array([is_question(t) for t in texts], dtype=bool)
        return np.where(asks, np.minimum(scores, 0.0), scores).astype(np.float32)

    def reply_sides(self, texts: Sequence[str], log_odds: np.ndarray) -> np.ndarray:
        """[N] int8 +1 clearly cheerful, -1 clearly sad, 0 neither, for stored replies and their
        `reply_log_odds`, each at its script's margin."""
        margins = np.array([self.spec.reply_sure[1 if has_hangul(t) else 0] for t in texts], np.float32)  # [N]
        return side(log_odds / np.maximum(margins, 1e-6), 1.0)


def side(log_odds: np.ndarray, sure: float) -> np.ndarray:
    """[N] int8: +1 at or past +sure, -1 at or past -sure, 0 between."""
    return np.where(log_odds >= sure, 1, np.where(log_odds <= -sure, -1, 0)).astype(np.int8)
