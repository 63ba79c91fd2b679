"""The reaction fallback: a linear classifier over the context vector, in numpy.

The classes are short replies mined from the corpus (`models/reactions.py`);
their weights ship in the bundle, so serving needs no torch. A class that takes
a side ("congrats!", "oh no, I'm sorry") is served only when the context leans
that way on its axis, measured against the bundle's anchor lines: a linear
classifier over a retrieval encoder's vectors tells good news from bad too
weakly to be trusted with "that's awesome!" to "my dad is in the hospital".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.bundle import REACTIONS_FILE, ReactionSpec
from core.encoder import Encoder


@dataclass(frozen=True)
class ReactionClassifier:
    labels: list[str]  # [C] in `language`
    weight: np.ndarray  # [C, D]
    bias: np.ndarray  # [C]
    language: str  # BCP 47: the conversations these reactions suit
    # BCP 47 -> [C] the same classes' text in another language; a multilingual
    # encoder puts a context near its translation, so one classifier serves both.
    translations: dict[str, list[str]] = field(default_factory=dict)
    axes: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))  # [A, D]
    axis_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [C] row of `axes`; -1: no side
    pole: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # [C] +1, -1; 0: no side
    margin: float = 0.0

    @classmethod
    def load(cls, bundle_dir: Path, spec: ReactionSpec, encoder: Encoder | None = None) -> ReactionClassifier:
        """`encoder` (the bundle's own) places the stance axes; a spec that names axes needs it."""
        with np.load(bundle_dir / REACTIONS_FILE) as saved:
            weight, bias = saved["weight"].astype(np.float32), saved["bias"].astype(np.float32)
        if weight.shape[0] != len(spec.labels) or bias.shape != (len(spec.labels),):
            raise ValueError(f"{REACTIONS_FILE}: {weight.shape} weights for {len(spec.labels)} labels")
        for language, texts in spec.translations.items():
            if len(texts) != len(spec.labels):
                raise ValueError(f"{len(texts)} {language} reactions for {len(spec.labels)} classes")
        axes, axis_of, pole = stance_axes(spec, encoder)
        return cls(
            list(spec.labels),
            weight,
            bias,
            spec.language,
            dict(spec.translations),
            axes,
            axis_of,
            pole,
            spec.stance_margin,
        )

    @property
    def languages(self) -> list[str]:
        return [self.language, *self.translations]

    def labels_in(self, language: str) -> list[str]:
        """[C] the classes' text in `language` (one of `languages`)."""
        return self.labels if language == self.language else self.translations[language]

    def probabilities(self, contexts: np.ndarray) -> np.ndarray:
        """contexts: [N, D] -> [N, C] class probabilities."""
        logits = contexts @ self.weight.T + self.bias  # [N, C]
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return np.asarray(exp / exp.sum(axis=1, keepdims=True))

    def allowed(self, context: np.ndarray) -> np.ndarray:
        """context: [D] -> [C] whether each class may answer: it takes no side, or the context
        leans its way by at least the margin."""
        if not len(self.axes):
            return np.ones(len(self.labels), dtype=bool)
        lean = leans(self.axes, self.axis_of, self.pole, context[None, :])[0]  # [C]
        return np.asarray((self.axis_of < 0) | (lean >= self.margin))

    def top(self, context: np.ndarray, k: int) -> list[tuple[int, float]]:
        """context: [D] -> the k likeliest (class, probability) among the allowed, best first."""
        probs = self.probabilities(context[None, :])[0]  # [C]
        allowed = self.allowed(context)  # [C]
        best = [c for c in np.argsort(-probs, kind="stable") if allowed[c]][:k]
        return [(int(c), float(probs[c])) for c in best]


def leans(axes: np.ndarray, axis_of: np.ndarray, pole: np.ndarray, contexts: np.ndarray) -> np.ndarray:
    """How far each context leans each class's way on its axis: axes [A, D], axis_of, pole [C],
    contexts [N, D] -> [N, C] (meaningless where a class takes no side: axis_of < 0)."""
    return np.asarray((contexts @ axes.T)[:, np.maximum(axis_of, 0)] * pole)  # [N, C]


def stance_axes(spec: ReactionSpec, encoder: Encoder | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The spec's axes placed by `encoder` -> (axes [A, D], axis_of [C], pole [C])."""
    names = list(spec.axes)
    axis_of = np.full(len(spec.labels), -1, dtype=np.int64)  # [C]
    pole = np.zeros(len(spec.labels), dtype=np.float32)  # [C]
    for c, stance in enumerate(spec.stances):
        if stance:
            axis, sign = stance[:-1], stance[-1]
            if axis not in spec.axes or sign not in "+-":
                raise ValueError(f"reaction {spec.labels[c]!r}: stance {stance!r} names no axis of {names}")
            axis_of[c], pole[c] = names.index(axis), 1.0 if sign == "+" else -1.0
    if spec.stances and len(spec.stances) != len(spec.labels):
        raise ValueError(f"{len(spec.stances)} stances for {len(spec.labels)} reactions")
    if not names:
        return np.zeros((0, 0), np.float32), axis_of, pole
    if encoder is None:
        raise ValueError("the reaction spec names stance axes: loading it needs the bundle's encoder")
    rows = []
    for axis in names:
        plus, minus = spec.axes[axis]
        rows.append(encoder.encode(plus, side="context").mean(0) - encoder.encode(minus, side="context").mean(0))
    return np.stack(rows).astype(np.float32), axis_of, pole  # [A, D]
