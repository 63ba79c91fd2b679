"""No cheer to bad news, from any strategy: the last turn's clear side against each stored reply's.

A stored reply's side (core/valence.py) is scored once, when its index version
is built, and kept with it (`IndexVersion.reply_moods`). A request reads its
last turn's side only when a hit it would serve takes one: most replies take
none, so most requests never read it. Where the turn leans bad past the
guard's margin, a clearly cheerful reply is passed over, and the next hit
answers, or a reaction; a sympathetic reply to good news likewise. The guard
acts before a turn is sure enough for a reaction to take its side: passing
over a cheerful reply costs little, serving one to bad news the most.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from core.laps import Laps, lap
from core.reactions import ReactionClassifier
from core.store import IndexVersion
from core.valence import Valence


@dataclass
class TurnReading:
    """The last turn as the reaction model reads it: its vector and its valence, each worked out
    once a request, on first need (the reader is an encoder pass)."""

    turn: str
    classifier: ReactionClassifier | None
    # [D] what a classifier without an encoder of its own reads: the turn's or the context's vector.
    own_vector: np.ndarray | None
    laps: Laps | None = None  # where the reader's pass adds its seconds ("read_turn")
    _vector: np.ndarray | None = field(default=None, init=False, repr=False)
    _lean: float | None = field(default=None, init=False, repr=False)

    def vector(self) -> np.ndarray:
        """[D] what the classifier reads for this turn."""
        if self._vector is None:
            if self.classifier is None or (self.own_vector is None and self.classifier.reader is None):
                raise ValueError("no classifier reads this turn")
            own = self.own_vector if self.own_vector is not None else np.zeros(0, np.float32)
            with lap(self.laps, "read_turn"):
                self._vector = self.classifier.vector(self.turn, own)
        return self._vector

    def lean(self) -> float | None:
        """The turn's valence in units of its margin (`Valence.turn_lean`); None where the classifier
        has no valence model."""
        valence = self.classifier.valence if self.classifier is not None else None
        if valence is None:
            return None
        if self._lean is None:
            self._lean = valence.turn_lean(self.turn, self.vector())
        return self._lean

    def side(self) -> int:
        """+1 sure good news, -1 sure bad news, 0 neither (or no valence model)."""
        lean = self.lean()
        valence = self.classifier.valence if self.classifier is not None else None
        return 0 if lean is None or valence is None else valence.turn_side(lean)

    def guarded_side(self) -> int:
        """The side the mood guard holds the turn to (`Valence.guarded_side`); 0 without a valence model."""
        lean = self.lean()
        valence = self.classifier.valence if self.classifier is not None else None
        return 0 if lean is None or valence is None else valence.guarded_side(self.turn, lean)


@dataclass(frozen=True)
class MoodGuard:
    reply_sides: np.ndarray  # [R] int8 per stored reply: +1 clearly cheerful, -1 clearly sad, 0 neither
    reading: TurnReading

    def blocks(self, row: int) -> bool:
        """Whether the stored reply at `row` takes the side opposite to the turn's clear one."""
        if not 0 <= row < len(self.reply_sides):
            return False
        reply = int(self.reply_sides[row])
        return reply != 0 and reply == -self.reading.guarded_side()


def reply_moods(index: IndexVersion, valence: Valence) -> np.ndarray:
    """[R] int8 the version's stored replies' clear sides: from the log-odds its build kept where the
    same valence model scored them, else scored now (about 60 us a reply)."""
    kept = index.reply_valence
    texts = index.reply_texts
    if kept is not None and kept[0] == valence.digest and len(kept[1]) == len(texts):
        return valence.reply_sides(texts, kept[1])
    return valence.reply_sides(texts, valence.reply_log_odds(texts))
