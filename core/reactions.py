"""The reaction fallback: a linear classifier over the context vector, in numpy.

The classes are short replies mined from the corpus (`models/reactions.py`);
their weights ship in the bundle, so serving needs no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.bundle import REACTIONS_FILE, ReactionSpec


@dataclass(frozen=True)
class ReactionClassifier:
    labels: list[str]  # [C] in `language`
    weight: np.ndarray  # [C, D]
    bias: np.ndarray  # [C]
    language: str  # BCP 47: the conversations these reactions suit
    # BCP 47 -> [C] the same classes' text in another language; a multilingual
    # encoder puts a context near its translation, so one classifier serves both.
    translations: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def load(cls, bundle_dir: Path, spec: ReactionSpec) -> ReactionClassifier:
        with np.load(bundle_dir / REACTIONS_FILE) as saved:
            weight, bias = saved["weight"].astype(np.float32), saved["bias"].astype(np.float32)
        if weight.shape[0] != len(spec.labels) or bias.shape != (len(spec.labels),):
            raise ValueError(f"{REACTIONS_FILE}: {weight.shape} weights for {len(spec.labels)} labels")
        for language, texts in spec.translations.items():
            if len(texts) != len(spec.labels):
                raise ValueError(f"{len(texts)} {language} reactions for {len(spec.labels)} classes")
        return cls(list(spec.labels), weight, bias, spec.language, dict(spec.translations))

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

    def top(self, context: np.ndarray, k: int) -> list[tuple[int, float]]:
        """context: [D] -> the k likeliest (class, probability), best first."""
        probs = self.probabilities(context[None, :])[0]  # [C]
        best = np.argsort(-probs, kind="stable")[:k]
        return [(int(c), float(probs[c])) for c in best]
