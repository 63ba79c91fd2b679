"""Korean chit-chat conversations we wrote for the multilingual fine-tune.

ChatterBot's 686 Korean pairs (models/chatterbot.py) are bot-flavoured and
were the only Korean conversation data the package index offers here. This
file adds 615 conversations (1,951 pairs) written for this project by
language-model assistants to our brief, by topic (food and money; work and
school; family, friends and feelings; hobbies, travel and weather; small
talk; less common everyday subjects), in the register Korean friends and
coworkers text in: mostly 반말, some 존댓말, short turns, ㅋㅋ and ㅠㅠ. The
writers never saw our evaluation sets. Its licence is the project's.

Our Korean evaluation sets were written the same way, and the writers came
back to the same situations ("출근하기 싫다", "월요일이라 더 그렇지"). Before
the file was committed, every conversation was dropped that had a pair,
as the tune cuts them, at a cosine of 0.94 or more to one of the
evaluation sets' conversations under zero-shot e5-small: of 760 written,
727 passed the check below and 615 this one. Even so, a
gain on those sets from this file can overstate what a set from other
sources would show.

At load time a conversation is also dropped whole when any of its lines is
a near copy of an evaluation line (core.text.near_copy: the same words
up to case and punctuation, or most of them), so an edit of this file
cannot bring one back.

A second file, translated, holds six-turn windows of chitchat's train split
(the BYU corpus, MIT): 480 drawn at random past each conversation's opening
greetings, translated into Korean chat by language-model assistants, each
line naming its source conversation and first turn. The same two checks
kept 470 (2,350 pairs). Their situations are the corpus's (American
students: classes, missions, movies, weekends), not our briefs', so they
teach the task on conversations unlike our evaluation sets'. Only the train
split is drawn from: the English evaluation sets stay unseen in either
language.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from core.encoder import Encoder
from core.text import Signature, near_copy
from models.chatterbot import held_out_lines, language_pairs
from models.dataset import TrainPairs

WRITTEN = Path(__file__).resolve().parent / "data" / "korean_conversations.jsonl"
TRANSLATED = WRITTEN.with_name("korean_translated_chitchat.jsonl")


def eval_signatures() -> list[Signature]:
    """Every line of our Korean evaluation sets, as the echo check compares them."""
    return [Signature.of(line) for line in sorted(held_out_lines())]


def written_conversations(path: Path = WRITTEN, held_out: list[Signature] | None = None) -> list[list[str]]:
    """{"turns": [...]} per line -> the turns of each conversation that shares no line with `held_out`
    (default: our Korean evaluation sets)."""
    if held_out is None:
        return [list(turns) for turns in _kept_against_eval_sets(path)]
    return _kept(path, held_out)


@functools.cache
def _kept_against_eval_sets(path: Path) -> tuple[tuple[str, ...], ...]:
    """The default check is a near-copy test of every line against every evaluation line: about a
    minute for both files, which the tune, the student and the tests each ask for more than once."""
    return tuple(tuple(turns) for turns in _kept(path, eval_signatures()))


def _kept(path: Path, held_out: list[Signature]) -> list[list[str]]:
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        turns = [t.strip() for t in json.loads(line)["turns"] if t.strip()]
        signatures = [Signature.of(t) for t in turns]
        if any(near_copy(s, h) for s in signatures for h in held_out):
            continue
        kept.append(turns)
    return kept


def written_korean_pairs(max_context_turns: int, separator: str, path: Path = WRITTEN) -> TrainPairs:
    """Each turn after the first as the reply to up to `max_context_turns` before it."""
    return language_pairs(written_conversations(path), max_context_turns, separator, held_out=set())


def nearest_written(
    encoder: Encoder, rows: list[dict[str, Any]], max_turns: int = 3, path: Path = WRITTEN
) -> np.ndarray:
    """[N] for each evaluation conversation, its cosine to the nearest written pair: how much the
    written file could have taught about it. Both sides as one text, turns joined by spaces,
    as the check before commit compared them (with zero-shot e5-small)."""
    pairs = written_korean_pairs(max_turns, " ", path)
    texts = [f"{context} {reply}" for context, reply in zip(pairs.contexts, pairs.replies, strict=True)]
    written = encoder.encode(texts, side="reply")  # [W, D]
    evaluated = encoder.encode([" ".join([*r["context"], r["reply"]]) for r in rows], side="reply")  # [N, D]
    return np.asarray((evaluated @ written.T).max(axis=1))  # [N]
