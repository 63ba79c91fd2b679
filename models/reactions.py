"""Reaction classes mined from the corpus, and the classifier that predicts them.

Daily conversation repeats itself: a few short replies ("haha", "yeah",
"nice") are a visible share of all turns. Those become a fixed set of
reactions, and a linear classifier over the context vector picks one when
retrieval is unsure (Pingpong's third task).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from core.bundle import ReactionSpec
from core.encoder import Encoder
from core.reactions import ReactionClassifier, leans, stance_axes
from core.text import normalize
from models.dataset import TrainPairs
from models.reaction_classes import REACTION_CLASSES, STANCE_AXES, ReactionClass

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
class ReactionSet:
    labels: list[str]  # [C] the surface form served for each class
    merge_keys: list[str]  # [C]
    coverage: float  # share of the replies that fall in a class

    @classmethod
    def from_labels(cls, labels: Sequence[str]) -> ReactionSet:
        """Rebuilt from a bundle's labels: each label is a member of its own class."""
        return cls(list(labels), [near_duplicate_key(reaction_key(label)) for label in labels], float("nan"))

    def classify(self, replies: Sequence[str]) -> np.ndarray:
        """[N] class index per reply, -1 where it is not a reaction."""
        index = {k: i for i, k in enumerate(self.merge_keys)}
        return np.array([index.get(near_duplicate_key(reaction_key(r)), -1) for r in replies], dtype=np.int64)


def mine(replies: Sequence[str], config: MiningConfig = MiningConfig()) -> ReactionSet:
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
    return ReactionSet(labels, [k for k, _ in kept], round(coverage, 4))


@dataclass
class ReactionModel:
    spec: ReactionSpec
    weight: np.ndarray  # [C, D]
    bias: np.ndarray  # [C]

    def save(self, path: Path) -> None:
        with path.open("wb") as f:
            np.savez(f, weight=self.weight.astype(np.float32), bias=self.bias.astype(np.float32))


def train_classifier(
    contexts: torch.Tensor,
    labels: torch.Tensor,
    classes: int,
    steps: int = 300,
    lr: float = 0.05,
    sample_weight: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax regression on frozen context vectors. contexts: [N, D], labels: [N] -> ([C, D], [C]).
    sample_weight: [N], mean 1; None weighs every example alike.

    Full-batch: N is a few thousand, so a step is a millisecond."""
    linear = torch.nn.Linear(contexts.shape[1], classes)
    opt = torch.optim.AdamW(linear.parameters(), lr=lr, weight_decay=1e-3)
    weight = torch.ones(len(labels)) if sample_weight is None else sample_weight
    for _ in range(steps):
        loss = (F.cross_entropy(linear(contexts), labels, reduction="none") * weight).mean()  # logits [N, C]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return linear.weight.detach().numpy().copy(), linear.bias.detach().numpy().copy()


TRIGGERS = Path(__file__).resolve().parent / "data" / "reaction_triggers.jsonl"


def class_examples(
    pairs: TrainPairs, classes: Sequence[ReactionClass], cap: int, seed: int
) -> tuple[list[str], list[int]]:
    """Contexts of train pairs whose reply is an example of a class, at most `cap` a class."""
    keys = {near_duplicate_key(reaction_key(e)): c for c, cls in enumerate(classes) for e in cls.examples}
    found: dict[int, list[int]] = {}
    for row, reply in enumerate(pairs.replies):
        label = keys.get(near_duplicate_key(reaction_key(reply)))
        if label is not None:
            found.setdefault(label, []).append(row)
    rng = np.random.default_rng(seed)
    contexts, labels = [], []
    for label, rows in sorted(found.items()):
        for row in rng.permutation(rows)[:cap]:
            contexts.append(pairs.contexts[int(row)])
            labels.append(label)
    return contexts, labels


def trigger_examples(classes: Sequence[ReactionClass], path: Path = TRIGGERS) -> tuple[list[str], list[int]]:
    """Our written lines that call for each class, in every language served."""
    index = {cls.name: c for c, cls in enumerate(classes)}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r["text"] for r in rows], [index[r["class"]] for r in rows]


def train_class_reactions(
    encoder: Encoder, pairs: TrainPairs, classes: Sequence[ReactionClass] = REACTION_CLASSES, cap: int = 1500
) -> tuple[ReactionModel, dict[str, Any]]:
    """A classifier over the served encoder's context vectors for the fixed `classes`.

    Examples: chitchat contexts whose reply is one of a class's examples, and
    our trigger lines. Every class weighs the same in the loss, and within a
    class the triggers weigh as much as the chitchat examples: chitchat has
    383 "haha"s and 5 "congrats". The stance margin is chosen on held-out
    trigger lines (`stance_margin`)."""
    chat, chat_labels = class_examples(pairs, classes, cap, seed=0)
    written, written_labels = trigger_examples(classes)
    texts, labels = chat + written, np.array(chat_labels + written_labels)  # [N]
    source = np.array([0] * len(chat) + [1] * len(written))  # [N] 0 chitchat, 1 trigger
    vectors = encoder.encode(texts, side="context")  # [N, D]
    weight, bias = _fit(vectors, labels, source, len(classes))
    languages = {language for cls in classes for language in cls.surface}
    spec = ReactionSpec(
        labels=[cls.surface["en"] for cls in classes],
        coverage=round(len(chat) / max(1, len(pairs)), 4),
        language="en",
        translations={lang: [cls.surface[lang] for cls in classes] for lang in sorted(languages - {"en"})},
        stances=[cls.stance for cls in classes],
        axes={name: [list(plus), list(minus)] for name, (plus, minus) in STANCE_AXES.items()},
    )
    margin, held_out = stance_margin(vectors, labels, source, spec, encoder)
    spec = replace(spec, stance_margin=margin)
    counts = {cls.name: int((labels == c).sum()) for c, cls in enumerate(classes)}
    return ReactionModel(spec, weight, bias), {
        "classes": len(classes),
        "chitchat_examples": len(chat),
        "trigger_examples": len(written),
        "per_class": counts,
        "stance_margin": margin,
        "held_out_triggers": held_out,
    }


def _fit(vectors: np.ndarray, labels: np.ndarray, source: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """vectors: [N, D], labels: [N], source: [N] (0 chitchat, 1 trigger) -> ([C, D], [C]),
    each class and, within it, each source weighing alike."""
    weights = np.zeros(len(labels), dtype=np.float32)  # [N]
    for c in range(classes):
        parts = [(labels == c) & (source == s) for s in (0, 1)]
        present = [p for p in parts if p.any()]
        for part in present:
            weights[part] = 1.0 / (len(present) * part.sum())
    weights *= len(labels) / weights.sum()
    torch.manual_seed(0)
    return train_classifier(
        torch.from_numpy(vectors), torch.from_numpy(labels), classes, sample_weight=torch.from_numpy(weights)
    )


# Margins tried, in the units of a context vector's projection on an axis: the chitchat train
# contexts' valence spans about -0.024..0.057 from the 5th to the 95th percentile.
MARGINS = tuple(round(0.005 * i, 3) for i in range(21))


def stance_margin(
    vectors: np.ndarray, labels: np.ndarray, source: np.ndarray, spec: ReactionSpec, encoder: Encoder, folds: int = 4
) -> tuple[float, dict[str, Any]]:
    """The smallest margin at which no held-out trigger line gets a reaction from the other side of its
    class's axis, the classifier fitted without that fold (vectors: [N, D], labels, source: [N]).

    Chosen on our trigger lines, never on bench/data/reactions_labelled.jsonl, which the bake-off reports."""
    written = np.flatnonzero(source == 1)  # [T]
    fold = np.arange(len(written)) % folds  # [T]
    probs = np.zeros((len(written), len(spec.labels)), dtype=np.float32)  # [T, C]
    for f in range(folds):
        train = np.ones(len(labels), dtype=bool)  # [N]
        train[written[fold == f]] = False
        weight, bias = _fit(vectors[train], labels[train], source[train], len(spec.labels))
        probs[fold == f] = ReactionClassifier(spec.labels, weight, bias, spec.language).probabilities(
            vectors[written[fold == f]]
        )
    axes, axis_of, pole = stance_axes(spec, encoder)
    lean = leans(axes, axis_of, pole, vectors[written])  # [T, C]
    truth = labels[written]  # [T]
    for margin in MARGINS:
        allowed = (axis_of < 0) | (lean >= margin)  # [T, C]
        served = np.argmax(np.where(allowed, probs, -1.0), axis=1)  # [T], as ReactionClassifier.top serves
        crossed = (axis_of[served] == axis_of[truth]) & (axis_of[truth] >= 0) & (pole[served] != pole[truth])  # [T]
        fits = float((served == truth).mean())
        if not crossed.any():
            return margin, {"fits": round(fits, 4), "crossed": 0, "lines": len(written)}
    return MARGINS[-1], {"fits": round(fits, 4), "crossed": int(crossed.sum()), "lines": len(written)}
