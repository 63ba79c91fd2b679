"""A conversation's context vector from its turns' own vectors: each turn encoded once.

ConveRT's multi-context: every turn of the window is encoded alone, and a small
learned combiner makes the context vector from those vectors. In a conversation
a turn's vector is kept (with the session's turn, and in the vector cache), so a
request encodes only its new message; the joined way re-encodes the whole window
every time (`Encoder.join_context`).

The combiner (COMBINER_FILE, named by the manifest's `combiner`):

    position p = 0 for the newest turn, 1 for the one before, ...
    l_p  = log1p(characters of turn p) / 4
    g_p  = exp(gate_bias[p] + gate_newest[p] * l_0 + gate_own[p] * l_p)    one weight a turn present
    u    = unit(sum_p g_p v_p)                                               v_p: turn p's unit vector
    out  = unit(u + u @ head + head_bias)                                    the context vector [D]

The length gates let a short newest turn ("yeah", "lol") lean on the turns
before it, where a long one answers for itself. Turns at an odd position are the
other speaker's (the bot's, in a session): where `reply_side[p]` they are read as
stored replies are (the reply side), so the vector of a reply the service sent is
the one already in the index, and no encoder pass is needed for it.

A combiner is part of its bundle's payload (COMBINER_FILE), so its checksum, which every cache
key, session vector and index version pins, changes with it. No torch here: the
recipe (models/e5/combiner.py) trains it, the service and the index build read it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from core.encoder import Side

LENGTH_SCALE = 4.0  # log1p(chars) / 4: about 0..1.7 for the 0..1,000 characters a turn may have


def unit(x: np.ndarray) -> np.ndarray:
    """Rows (or one vector) scaled to length 1; a zero row stays zero."""
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.asarray(x / np.maximum(norm, 1e-12), dtype=np.float32)


def length_feature(text: str) -> float:
    return math.log1p(len(text)) / LENGTH_SCALE


@dataclass(frozen=True)
class Combiner:
    gate_bias: np.ndarray  # [N]
    gate_newest: np.ndarray  # [N] the newest turn's length feature, for every position's gate
    gate_own: np.ndarray  # [N] each turn's own length feature
    head: np.ndarray  # [D, D] a residual map of the pooled turns, zero-initialised in training
    head_bias: np.ndarray  # [D]
    reply_side: np.ndarray  # [N] bool: turns at this position are encoded on the reply side

    @property
    def turns(self) -> int:
        """N: the newest turns the context vector reads."""
        return len(self.gate_bias)

    @classmethod
    def load(cls, path: Path) -> Combiner:
        """A combiner file (`save`'s), checked for shape."""
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        combiner = cls(
            gate_bias=arrays["gate_bias"].astype(np.float32),
            gate_newest=arrays["gate_newest"].astype(np.float32),
            gate_own=arrays["gate_own"].astype(np.float32),
            head=arrays["head"].astype(np.float32),
            head_bias=arrays["head_bias"].astype(np.float32),
            reply_side=arrays["reply_side"].astype(bool),
        )
        combiner.check()
        return combiner

    def save(self, path: Path) -> None:
        with path.open("wb") as f:
            np.savez(
                f,
                gate_bias=self.gate_bias,
                gate_newest=self.gate_newest,
                gate_own=self.gate_own,
                head=self.head,
                head_bias=self.head_bias,
                reply_side=self.reply_side,
            )

    def check(self, dim: int | None = None) -> None:
        n = self.turns
        if not 1 <= n <= 16 or self.reply_side[0]:
            raise ValueError(f"a combiner reads 1 to 16 turns, the newest on the context side (got {n})")
        shapes = (self.gate_newest.shape, self.gate_own.shape, self.reply_side.shape)
        if any(shape != (n,) for shape in shapes):
            raise ValueError("a combiner's gates and sides need one value per position")
        d = self.head.shape[0]
        if self.head.shape != (d, d) or self.head_bias.shape != (d,) or (dim is not None and d != dim):
            raise ValueError(f"a combiner's head is [D, D] with D = the encoder's {dim}")

    def sides(self, count: int) -> list[Side]:
        """The side each of the newest `count` turns (oldest first, as a window is) is encoded on."""
        count = min(count, self.turns)
        return ["reply" if self.reply_side[count - 1 - i] else "context" for i in range(count)]

    def window(self, turns: Sequence[str]) -> list[str]:
        """The turns the context vector reads: the newest N, oldest first."""
        return list(turns[-self.turns :])

    def combine(self, vectors: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        """vectors: [T, D] the window's turn vectors, oldest first, each on its `sides` side; texts:
        the T turns (their lengths gate them). Returns the [D] unit context vector."""
        newest_first = np.zeros((1, self.turns, vectors.shape[1]), dtype=np.float32)  # [1, N, D]
        recent = vectors[-self.turns :]
        newest_first[0, : len(recent)] = recent[::-1]
        return np.asarray(self.combine_many(newest_first, [list(texts)])[0])

    def combine_many(self, vectors: np.ndarray, windows: Sequence[Sequence[str]]) -> np.ndarray:
        """vectors: [B, N, D] newest first, zero where a window has fewer turns; windows: B lists of
        turns, oldest first. Returns [B, D] unit context vectors."""
        b, n = len(windows), self.turns
        lengths = np.zeros((b, n), dtype=np.float32)  # [B, N]
        present = np.zeros((b, n), dtype=np.float32)  # [B, N]
        for i, window in enumerate(windows):
            for p, text in enumerate(reversed(list(window)[-n:])):
                lengths[i, p], present[i, p] = length_feature(text), 1.0
        gates = np.exp(self.gate_bias[None] + self.gate_newest[None] * lengths[:, :1] + self.gate_own[None] * lengths)
        if vectors.shape[1] != n:
            raise ValueError(f"the combiner reads {n} positions, got {vectors.shape[1]}")
        pooled = unit(np.einsum("bn,bnd->bd", gates * present, vectors))  # [B, D]
        return unit(pooled + pooled @ self.head + self.head_bias)  # [B, D]


def turn_vectors(
    windows: Sequence[Sequence[str]], turns: int, vector_of: dict[tuple[str, Side], np.ndarray], combiner: Combiner
) -> np.ndarray:
    """[B, N, D] each window's turn vectors newest first (zero past its oldest), from `vector_of`
    ((text, side) -> [D], every window turn on its side present)."""
    dim = next(iter(vector_of.values())).shape[-1] if vector_of else combiner.head.shape[0]
    out = np.zeros((len(windows), turns, dim), dtype=np.float32)  # [B, N, D]
    for i, window in enumerate(windows):
        recent = list(window)[-turns:]
        for p, (text, side) in enumerate(reversed(list(zip(recent, combiner.sides(len(recent)), strict=True)))):
            out[i, p] = vector_of[(text, side)]
    return out
