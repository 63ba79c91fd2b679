"""What the reaction head learns from, and the texts its gates are chosen and judged on."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.reactions import emotions
from models.reactions.classes import CLASS_NAMES, KINDS, REACTION_CLASSES, STANCE_AXES, text_kind, text_valence
from models.reactions.model import ReactionConfig

ROOT = Path(__file__).resolve().parents[2]
TRIGGERS = ROOT / "models" / "data" / "reaction_triggers.jsonl"
LABELLED = ROOT / "bench" / "data" / "reactions_labelled.jsonl"


@dataclass
class Examples:
    """Texts with what each teaches: the columns of the head's training set."""

    texts: list[str] = field(default_factory=list)  # [N]
    language: list[str] = field(default_factory=list)  # [N]
    source: list[str] = field(default_factory=list)  # [N] an emotion source, "written" or "axis"
    label: list[int] = field(default_factory=list)  # [N] class index, -1: none (valence only)
    valence: list[int] = field(default_factory=list)  # [N] +1, -1, 0

    def add(self, text: str, language: str, source: str, label: int, valence: int) -> None:
        self.texts.append(text)
        self.language.append(language)
        self.source.append(source)
        self.label.append(label)
        self.valence.append(valence)

    def __len__(self) -> int:
        return len(self.texts)


def written_lines(path: Path = TRIGGERS) -> list[dict[str, str]]:
    """Our lines that call for each class, in every language served: {"class", "language", "text"}."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def labelled_lines(path: Path = LABELLED) -> list[dict[str, Any]]:
    """The gate's lines: {"category", "language", "text", "source", "half", ...}."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _sample(items: list[Any], n: int, seed: str) -> list[Any]:
    """At most n of `items`, the same ones on every run (by a hash of each text and `seed`)."""
    key = lambda t: hashlib.sha1(f"{seed}\n{t.text}".encode()).hexdigest()  # noqa: E731
    return sorted(items, key=key)[:n]


# Sources each language learns from; the machine translation last, as the weakest.
TRAIN_SOURCES = {"en": ("goemotions",), "ko": ("kote", "goemotions_ko_mt")}
POLARITY_SOURCES = {"en": ("goemotions",), "ko": ("kote", "nsmc", "goemotions_ko_mt")}


def training_examples(config: ReactionConfig, directory: Path = emotions.EMOTIONS_DIR) -> Examples:
    """The train splits mapped through the table, our trigger lines and the valence anchor lines."""
    index = {name: c for c, name in enumerate(CLASS_NAMES)}
    out = Examples()
    for language, sources in TRAIN_SOURCES.items():
        for source in sources:
            by_kind: dict[str, list[emotions.Text]] = {}
            for t in emotions.split(source, "train", directory):
                kind = text_kind(source, list(t.labels))
                if kind:
                    by_kind.setdefault(kind, []).append(t)
            for kind, found in sorted(by_kind.items()):
                for t in _sample(found, config.per_class, f"{config.seed}:{source}:{kind}"):
                    out.add(t.text, language, source, index[KINDS[kind].trains], KINDS[kind].valence)
    taken = set(out.texts)
    for language, sources in POLARITY_SOURCES.items():
        for source in sources:
            for side in (1, -1):
                found = [
                    t
                    for t in emotions.split(source, "train", directory)
                    if text_valence(source, list(t.labels)) == side and t.text not in taken
                ]
                for t in _sample(found, config.valence_per_side, f"{config.seed}:{source}:{side}"):
                    out.add(t.text, language, source, -1, side)
    stance = {c.name: c.stance for c in REACTION_CLASSES}
    for row in written_lines():
        side = {"valence+": 1, "valence-": -1}.get(stance[row["class"]], 0)
        out.add(row["text"], row["language"], "written", index[row["class"]], side)
    plus, minus = STANCE_AXES["valence"]
    for lines, side in ((plus, 1), (minus, -1)):
        for text in lines:
            out.add(text, "ko" if _hangul(text) else "en", "axis", -1, side)
    return out


def _hangul(text: str) -> bool:
    return any("\uac00" <= ch <= "\ud7a3" for ch in text)


@dataclass
class Judged:
    """Texts the gates are chosen or reported on, each with its kind (or only its side)."""

    texts: list[str]  # [N]
    language: list[str]  # [N]
    kind: list[str]  # [N] a KINDS key, "" for a polarity-only text
    side: list[int]  # [N] +1 clearly good, -1 clearly bad, 0 neither
    source: list[str]  # [N]


def side_of_kind(kind: str) -> int:
    """+1 for good news (cheer fits), -1 for bad news (sympathy fits), 0 for every other kind."""
    return {"bad_news": -1, "good_news": 1, "achievement": 1}.get(kind, 0)


def emotion_split(name: str, per_source: int, seed: int, directory: Path = emotions.EMOTIONS_DIR) -> Judged:
    """The dev or test splits' texts that are clearly good or clearly bad news (by kind, or for
    NSMC by polarity), at most `per_source` a source."""
    out = Judged([], [], [], [], [])
    for source, (_, language) in emotions.FILES.items():
        clear = []
        for t in emotions.split(source, name, directory):
            kind = text_kind(source, list(t.labels))
            side = side_of_kind(kind) if source != "nsmc" else text_valence(source, list(t.labels))
            if side:
                clear.append((t, kind, side))
        key = lambda item: hashlib.sha1(f"{seed}\n{item[0].text}".encode()).hexdigest()  # noqa: E731
        for t, kind, side in sorted(clear, key=key)[:per_source]:
            out.texts.append(t.text)
            out.language.append(language)
            out.kind.append(kind)
            out.side.append(side)
            out.source.append(source)
    return out
