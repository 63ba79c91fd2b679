"""Gate settings scored: what a head answers under each, the verdicts and sides of those answers, and
the setting the recipe's rule chooses."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from core.reactions import ReactionClassifier, first_answers, guarded
from models.reactions.classes import CLASS_NAMES, FALLBACK, STANCE_AXES, verdict
from models.reactions.gates import Gates
from models.reactions.model import ReactionConfig, ReactionModel

CHEER = frozenset({"congrats", "great", "cool", "laugh"})  # the cheerful reactions: wrong to bad news


def side_of_class(name: str | None) -> int:
    """+1 for a cheerful reaction, -1 for sympathy, 0 for one that takes no side (or none)."""
    return 1 if name in CHEER else -1 if name == "sympathy" else 0


@dataclass
class HeadScores:
    """What the gates act on, computed once: the head's probabilities, each class's lean and the
    valence (log-odds of good news)."""

    probs: np.ndarray  # [N, C]
    leans: np.ndarray  # [N, C] before any margin
    valence: np.ndarray  # [N]
    axis_of: np.ndarray  # [C]
    pole: np.ndarray  # [C]

    @classmethod
    def of(cls, classifier: ReactionClassifier, vectors: np.ndarray) -> HeadScores:
        row = list(STANCE_AXES).index("valence")
        valence = vectors @ classifier.axes[row] + classifier.axis_bias[row]  # [N]
        return cls(
            classifier.probabilities(vectors),
            classifier.raw_leans(vectors),
            valence,
            classifier.axis_of,
            classifier.pole,
        )

    def answers(self, gates: Gates) -> np.ndarray:
        """[N] the class each context is answered with first under `gates`, as the service answers."""
        per_axis = np.array([gates.margins()[name] for name in STANCE_AXES])  # [A]
        need = np.where(self.axis_of >= 0, per_axis[np.maximum(self.axis_of, 0)], 0.0)  # [C]
        allowed = (self.axis_of < 0)[None, :] | (self.leans >= need[None, :])  # [N, C]
        fallback = CLASS_NAMES.index(FALLBACK)
        for pole_name, lean in gates.guards().items():
            row, sign = list(STANCE_AXES).index(pole_name[:-1]), 1.0 if pole_name[-1] == "+" else -1.0
            toward = (self.valence * sign)[:, None]  # [N, 1]
            guard = (np.array([row]), np.array([sign]), np.array([lean]))
            allowed &= guarded(toward, guard[2], guard[0], guard[1], self.axis_of, self.pole, fallback)
        return first_answers(self.probs, allowed, np.array(gates.floors()), fallback)


def verdicts(served: np.ndarray, kinds: Sequence[str]) -> list[str]:
    """[N] "fits", "neutral" or "wrong" for the class each turn of `kinds` is answered with."""
    return [verdict(k, CLASS_NAMES[s] if s >= 0 else None) for k, s in zip(kinds, served.tolist(), strict=True)]


VERDICTS = ("fits", "neutral", "wrong")


def verdict_table(kinds: Sequence[str]) -> np.ndarray:
    """[N, C + 1] the verdict code (an index of VERDICTS) of each class, and of no reaction (last), per turn."""
    names = [*CLASS_NAMES, None]
    return np.array([[VERDICTS.index(verdict(k, name)) for name in names] for k in kinds], dtype=np.int64)


CLASS_SIDES = np.array([side_of_class(name) for name in CLASS_NAMES] + [0])  # [C + 1], the last: no reaction


def side_accuracy(served: np.ndarray, gold: np.ndarray) -> tuple[float, float]:
    """served: [N] classes (-1: none), gold: [N] +1/-1 -> (share right where a side is taken, share taking one)."""
    taken = CLASS_SIDES[served]  # [N]
    decided = taken != 0  # [N]
    right = float((taken[decided] == gold[decided]).mean()) if decided.any() else 1.0
    return right, float(decided.mean()) if len(decided) else 0.0


def choose_gates(
    model: ReactionModel,
    labelled: tuple[np.ndarray, list[str], list[str]],
    dev: tuple[np.ndarray, np.ndarray, list[str]],
    config: ReactionConfig,
) -> tuple[Gates, dict[str, Any]]:
    """The gates by the rule in models/reactions/head.py's docstring. labelled: (vectors [N, D], kinds [N],
    languages [N]) of half A; dev: (vectors [M, D], gold sides [M], sources [M]): the side bar
    holds on each source."""
    classifier = model.classifier()
    vectors, kinds, languages = labelled
    dev_vectors, dev_sides, dev_sources = dev
    scored, dev_scored = HeadScores.of(classifier, vectors), HeadScores.of(classifier, dev_vectors)
    by_language = {lang: np.array(languages) == lang for lang in sorted(set(languages))}
    dev_by_source = {name: np.array(dev_sources) == name for name in config.side_sources if name in dev_sources}
    table = verdict_table(kinds)  # [N, C + 1]
    tried: list[dict[str, Any]] = []
    for valence, guard, phase, sided, floor, mirror in itertools.product(
        config.valence_grid,
        config.guard_grid,
        config.phase_grid,
        config.sided_grid,
        config.floor_grid,
        config.mirror_grid,
    ):
        gates = Gates(valence, guard, sided, floor, mirror, phase)
        judged = table[np.arange(len(table)), scored.answers(gates)]  # [N] verdict codes
        served = dev_scored.answers(gates)  # [M]
        tried.append(
            {
                "gates": asdict(gates),
                "wrong": int((judged == 2).sum()),
                "fits": round(min(float((judged[m] == 0).mean()) for m in by_language.values()), 4),
                "side_accuracy": round(
                    min(side_accuracy(served[m], dev_sides[m])[0] for m in dev_by_source.values()), 4
                ),
            }
        )
    ok = [r for r in tried if r["wrong"] == 0 and r["side_accuracy"] >= config.side_accuracy]
    if not ok:  # nothing meets both: the fewest wrong, then the most accurate sides
        ok = sorted(tried, key=lambda r: (r["wrong"], -r["side_accuracy"]))[:1]

    # The most that fit (in the weaker language); among equals the safest: the highest gates.
    def safest(r: dict[str, Any]) -> tuple[float, ...]:
        g = r["gates"]
        return (r["fits"], g["valence"], g["mirror"], g["floor"], g["sided"], -g["guard"])

    best = max(ok, key=safest)
    return Gates(**best["gates"]), {**best, "tried": len(tried), "meeting_the_rule": len(ok)}
