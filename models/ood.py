"""The out-of-domain dev sets: what releases are gated on and nothing trains on.

- chatterbot-corpus, English and Korean (`chatterbot-corpus==1.3.3`,
  BSD-3-Clause): short bot conversations by topic. Its language folders
  translate one another, so no folder of it may train a model that is judged
  on another. Cut as the chitchat corpus is: each turn after the first is the
  reply to up to 3 turns before it. Scored per distinct context: the right
  answer is any reply that followed that context somewhere in the folder.
- the human chit-chat dev sets in `../shared/data/dev/` (Topical-Chat valid,
  English; ChatbotData, Korean): conversations between people, where a
  reply answers rather than repeats. Encoders are chosen on these.
- STS dev sets in `../shared/data/sts/` (SemEval-2015 headlines and image
  captions, KorSTS dev): sentence pairs with a gold similarity, scored by
  Spearman's rank correlation of `/similar`'s pair scores.

Every reply set splits its contexts into two fixed halves by a hash of the
context (`half`): choices are made on half A, and half B is reported beside.

`held_out_keys` is every line of these sets, normalised: the training
pipeline drops any text of its own that equals one (models/broad_text.py).
No torch here.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from core.text import normalize
from models.chatterbot import conversations, data_dir

ROOT = Path(__file__).resolve().parents[1]
STS_DIR = ROOT.parent / "shared" / "data" / "sts"
DEV_DIR = ROOT.parent / "shared" / "data" / "dev"
HUMAN_SETS = {"topical_chat_valid": "en", "chatbotdata_ko_dev": "ko"}
CHATTERBOT_LANGUAGES = {"en": "english", "ko": "korean"}
STS_SETS = {"sts15_headlines": "en", "sts15_images": "en", "korsts_dev": "ko"}
MAX_CONTEXT_TURNS = 3


@dataclass(frozen=True)
class ReplySet:
    """One language's conversations as a 1-of-N task over every distinct reply."""

    language: str
    contexts: list[tuple[str, ...]]  # [C] distinct contexts, oldest turn first
    gold: list[frozenset[str]]  # [C] normalised replies that followed each context
    replies: list[str]  # [N] every distinct reply, first spelling seen

    def hit(self, context: int, reply: str) -> bool:
        return normalize(reply) in self.gold[context]

    @property
    def halves(self) -> list[str]:
        """[C] "A" or "B" per context."""
        return [half(c) for c in self.contexts]


def half(context: tuple[str, ...]) -> str:
    """A context's fixed half: "A" (choose on it) or "B" (report it), by a hash of its normalised turns."""
    digest = hashlib.sha256("\n".join(normalize(t) for t in context).encode("utf-8")).digest()
    return "A" if digest[0] % 2 == 0 else "B"


def human_set(name: str, directory: Path = DEV_DIR) -> ReplySet:
    """A human chit-chat dev set (`{"context": [...], "reply": ...}` records) as a reply set."""
    gold: dict[tuple[str, ...], set[str]] = {}
    replies: dict[str, str] = {}
    for record in json.loads((directory / f"{name}.json").read_text(encoding="utf-8")):
        context = tuple(record["context"][-MAX_CONTEXT_TURNS:])
        replies.setdefault(normalize(record["reply"]), record["reply"])
        gold.setdefault(context, set()).add(normalize(record["reply"]))
    contexts = list(gold)
    return ReplySet(HUMAN_SETS[name], contexts, [frozenset(gold[c]) for c in contexts], list(replies.values()))


def available_human(directory: Path = DEV_DIR) -> list[str]:
    return [name for name in HUMAN_SETS if (directory / f"{name}.json").is_file()]


def chatterbot_set(language: str, max_context_turns: int = MAX_CONTEXT_TURNS, max_chars: int = 1000) -> ReplySet:
    """chatterbot-corpus's folder for `language` ("en" or "ko") as a reply set. Turns longer than
    `max_chars` (the API's limit on a turn: one 1,087-character code listing in English) are
    left out: as a candidate, and the contexts they are in."""
    gold: dict[tuple[str, ...], set[str]] = {}
    replies: dict[str, str] = {}
    for turns in conversations(data_dir() / CHATTERBOT_LANGUAGES[language]):
        for i in range(1, len(turns)):
            context = tuple(turns[max(0, i - max_context_turns) : i])
            if len(turns[i]) > max_chars:
                continue
            replies.setdefault(normalize(turns[i]), turns[i])
            if all(len(t) <= max_chars for t in context):
                gold.setdefault(context, set()).add(normalize(turns[i]))
    contexts = list(gold)
    return ReplySet(language, contexts, [frozenset(gold[c]) for c in contexts], list(replies.values()))


@dataclass(frozen=True)
class StsSet:
    name: str
    language: str
    pairs: list[tuple[str, str]]  # [P]
    gold: list[float]  # [P] 0..5


def sts_set(name: str, directory: Path = STS_DIR) -> StsSet:
    """A scored STS file; rows without a gold score are skipped (the README of the folder says so)."""
    path = directory / f"{name}.tsv"
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if name.startswith("korsts"):  # header; genre, filename, year, id, score, sentence1, sentence2
        rows = [[r[4], r[5], r[6]] for r in rows[1:] if len(r) >= 7]
    pairs, gold = [], []
    for row in rows:
        if len(row) < 3 or not row[0].strip():
            continue
        pairs.append((row[1], row[2]))
        gold.append(float(row[0]))
    return StsSet(name, STS_SETS[name], pairs, gold)


def available_sts(directory: Path = STS_DIR) -> list[str]:
    return [name for name in STS_SETS if (directory / f"{name}.tsv").is_file()]


def held_out_keys(directory: Path = STS_DIR) -> set[str]:
    """Every line of every out-of-domain set, normalised, in all of chatterbot's languages."""
    keys: set[str] = set()
    for folder in data_dir().iterdir():
        if folder.is_dir():
            keys.update(normalize(t) for turns in conversations(folder) for t in turns)
    for name in available_sts(directory):
        keys.update(normalize(t) for pair in sts_set(name, directory).pairs for t in pair)
    return keys
