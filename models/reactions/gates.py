"""The gates a reaction head answers under, and how they go into its spec."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from models.reactions.classes import REACTION_CLASSES
from models.reactions.model import ReactionModel


@dataclass(frozen=True)
class Gates:
    valence: float  # probability of its side a class that takes one needs
    guard: float  # probability of bad news at or past which only sympathy and the fallback answer
    sided: float  # the floor of a class that takes a side (its axis already vouches for it)
    floor: float  # the floor of every other class
    mirror: float  # the floor of a mirror
    phase: float  # the phase axis's margin

    def margins(self) -> dict[str, float]:
        """axis -> the lean a class needs: valence in log-odds, phase in its own units."""
        return {"valence": _logit(self.valence), "phase": self.phase}

    def guards(self) -> dict[str, float]:
        return {"valence-": _logit(self.guard)} if self.guard < 1 else {}

    def floors(self) -> list[float]:
        """[C] per class; the fallback always may answer."""
        return [
            0.0
            if c.role == "fallback"
            else self.mirror
            if c.role == "mirror"
            else self.sided
            if c.stance
            else self.floor
            for c in REACTION_CLASSES
        ]


def _logit(p: float) -> float:
    return round(math.log(p / (1 - p)), 4)


def with_gates(model: ReactionModel, gates: Gates) -> ReactionModel:
    spec = replace(model.spec, margins=gates.margins(), floors=gates.floors(), guards=gates.guards())
    return replace(model, spec=spec)
