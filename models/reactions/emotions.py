"""The emotion-labelled sets the reaction model learns from, and the splits it is judged on.

They live outside the repository, at ../shared/data/emotions beside the clone
(CHITCHAT_EMOTIONS_DIR overrides it): GoEmotions (English, CC BY 4.0), KOTE
(Korean, MIT), NSMC polarity (Korean, CC0) and a machine translation of
GoEmotions into Korean (its README, and docs/reactions.md, give sources and
licences). Each file is gzip'd JSONL, one text a line:
{"id", "text", "labels": [names], "source", "split"}.

Training reads only the train splits (KOTE has none here: four fifths of its
val split, by a hash of the id); GoEmotions' dev splits, and the other fifth of
KOTE's val and of NSMC's train split (NSMC has no dev split), choose; every
test split stays held out for the report.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EMOTIONS_DIR = Path(os.environ.get("CHITCHAT_EMOTIONS_DIR", ROOT.parent / "shared" / "data" / "emotions"))

# source -> (file, language); the source names are those models.reactions.classes.EMOTION_LABELS maps.
FILES = {
    "goemotions": ("goemotions_en.jsonl.gz", "en"),
    "kote": ("kote_ko.jsonl.gz", "ko"),
    "nsmc": ("nsmc_ko_polarity.jsonl.gz", "ko"),
    "goemotions_ko_mt": ("goemotions_ko_translated.jsonl.gz", "ko"),
}
# Each file's own split names -> ours: "train" (learn), "dev" (choose), "test" (held out, reported).
# 1 in 5 texts of a split with no dev split beside it chooses; the other four train: KOTE's val split (its
# train split is missing here), NSMC's train split (it has none).
DEV_SHARE = {"kote": ("val", 5), "nsmc": ("train", 5)}


@dataclass(frozen=True)
class Text:
    source: str  # a key of FILES
    id: str  # the source's own id
    text: str
    labels: tuple[str, ...]
    split: str  # "train", "dev" or "test"

    @property
    def language(self) -> str:
        return FILES[self.source][1]


def available(directory: Path = EMOTIONS_DIR) -> bool:
    return all((directory / name).is_file() for name, _ in FILES.values())


def _split(source: str, id: str, split: str) -> str:
    carved, share = DEV_SHARE.get(source, ("", 0))
    if split == carved:
        return "dev" if int(hashlib.sha1(id.encode()).hexdigest(), 16) % share == 0 else "train"
    return {"train": "train", "dev": "dev", "test": "test"}[split]


@cache
def texts(source: str, directory: Path = EMOTIONS_DIR) -> tuple[Text, ...]:
    """Every text of a source, with our split names, in file order."""
    name, _ = FILES[source]
    with gzip.open(directory / name, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return tuple(
        Text(
            source,
            str(r["id"]),
            " ".join(r["text"].split()),
            tuple(r["labels"]),
            _split(source, str(r["id"]), r["split"]),
        )
        for r in rows
        if r["text"].strip()
    )


def split(source: str, name: str, directory: Path = EMOTIONS_DIR) -> list[Text]:
    return [t for t in texts(source, directory) if t.split == name]
