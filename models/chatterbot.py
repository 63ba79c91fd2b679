"""Conversation pairs in 27 languages from the `chatterbot-corpus` package (BSD-3-Clause).

ChatterBot's corpus is short conversations by topic (greetings, food,
emotion, ...) in YAML, one folder per language: 696 (context, reply) pairs
in Korean and about 10k in the other non-English languages. It is small and
bot-flavoured ("Are you a robot?"), but it is the only conversation data in
those languages that installs from the package index here, and it gives the
multilingual fine-tune in-language pairs next to the English chitchat ones.

Pairs are cut as the chitchat corpus is: each turn after the first is a
reply to up to `max_context_turns` turns before it. Pairs that share a line
with our own Korean evaluation sets are left out, so those sets stay unseen.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from core.text import normalize
from index.corpus import MAX_CANDIDATE_CHARS
from models.dataset import TrainPairs
from models.evalset import KOREAN_DEV, KOREAN_TESTS, korean_rows

KOREAN_EVAL_SETS = (KOREAN_DEV, KOREAN_TESTS)


def data_dir() -> Path:
    import chatterbot_corpus

    return Path(chatterbot_corpus.__file__).parent / "data"


def conversations(folder: Path) -> list[list[str]]:
    """Every conversation in a language folder, as its turns."""
    found = []
    for path in sorted(folder.glob("*.yml")):
        for turns in yaml.safe_load(path.read_text(encoding="utf-8")).get("conversations") or []:
            found.append([str(t).strip() for t in turns if t is not None and str(t).strip()])
    return found


def held_out_lines(paths: tuple[Path, ...] = KOREAN_EVAL_SETS) -> set[str]:
    """Normalised lines of the evaluation sets: contexts and replies."""
    lines: set[str] = set()
    for path in paths:
        for row in korean_rows(path):
            lines.update(normalize(t) for t in [*row["context"], row["reply"]])
    return lines


def language_pairs(
    turns_per_conversation: list[list[str]], max_context_turns: int, separator: str, held_out: set[str]
) -> TrainPairs:
    contexts, replies = [], []
    for turns in turns_per_conversation:
        for i in range(1, len(turns)):
            context, reply = turns[max(0, i - max_context_turns) : i], turns[i]
            if len(reply) > MAX_CANDIDATE_CHARS or any(normalize(t) in held_out for t in [*context, reply]):
                continue
            contexts.append(separator.join(context))
            replies.append(reply)
    return TrainPairs(contexts, replies)


def chatterbot_pairs(max_context_turns: int, separator: str, min_replies: int) -> dict[str, TrainPairs]:
    """Language folder name -> its pairs, English left out (the chitchat corpus covers it), and
    languages with fewer than `min_replies` distinct replies (not one batch of negatives)."""
    held_out = held_out_lines()
    found = {}
    for folder in sorted(p for p in data_dir().iterdir() if p.is_dir() and p.name != "english"):
        pairs = language_pairs(conversations(folder), max_context_turns, separator, held_out)
        if len(set(pairs.reply_keys)) >= min_replies:
            found[folder.name] = pairs
    return found
