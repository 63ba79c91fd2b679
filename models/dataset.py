"""The train split as (context, reply) text pairs, with what batching needs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.text import normalize
from index.corpus import MAX_CANDIDATE_CHARS, load_pairs

TURN_SEPARATOR = " [SEP] "  # Dialog-BERT: an explicit separator between turns helps


@dataclass(frozen=True)
class TrainPairs:
    contexts: list[str]  # [N] the last turns joined with TURN_SEPARATOR
    replies: list[str]  # [N]

    def __len__(self) -> int:
        return len(self.replies)

    @property
    def reply_keys(self) -> list[str]:
        """[N] normalised replies: two rows with one key must not share a batch."""
        return [normalize(r) for r in self.replies]

    @property
    def lengths(self) -> list[int]:
        """[N] characters of context and reply, a proxy for the tokens a row pads a batch to."""
        return [len(c) + len(r) for c, r in zip(self.contexts, self.replies, strict=True)]

    def __add__(self, other: TrainPairs) -> TrainPairs:
        return TrainPairs(self.contexts + other.contexts, self.replies + other.replies)

    def rows(self, rows: list[int]) -> tuple[list[str], list[str]]:
        return [self.contexts[i] for i in rows], [self.replies[i] for i in rows]


def train_pairs(max_context_turns: int, path: Path | None = None, separator: str = TURN_SEPARATOR) -> TrainPairs:
    """Every train pair whose reply is within the candidate cap: what the index could serve."""
    pairs = [p for p in load_pairs("train", max_context_turns, path) if len(p.reply) <= MAX_CANDIDATE_CHARS]
    return TrainPairs([separator.join(p.context) for p in pairs], [p.reply for p in pairs])
