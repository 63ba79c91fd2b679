"""1-of-100 response selection: the held-out examples and the ranks on them.

For each example the true next turn competes with 99 replies drawn from the
other examples (fixed seed, never a reply equal to the true one once
normalised). Ranks are strict: a negative must score higher to push the true
reply down, and a tie does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.text import normalize
from index.corpus import Split, load_pairs

CANDIDATES = 100
ROOT = Path(__file__).resolve().parents[1]
# Korean conversations we wrote, never trained on: the dev set judges multilingual releases, the other is tests' own.
KOREAN_DEV = ROOT / "bench" / "data" / "korean_dev.jsonl"
KOREAN_TESTS = ROOT / "tests" / "data" / "korean_chitchat.jsonl"


def korean_rows(path: Path = KOREAN_DEV) -> list[dict[str, Any]]:
    """{"context": [turns], "reply": text} per line."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass
class EvalSet:
    contexts: list[list[str]]  # [N] turns, oldest first
    replies: list[str]  # [N]
    negatives: np.ndarray  # [N, 99] rows of `replies`

    def joined(self, separator: str, turns: int) -> list[str]:
        return [separator.join(c[-turns:]) for c in self.contexts]

    @property
    def candidates(self) -> np.ndarray:
        """[N, 100] rows of `replies`, the true one first."""
        return np.concatenate([np.arange(len(self.replies))[:, None], self.negatives], axis=1)


def eval_set(
    n: int = 2000, seed: int = 0, split: Split = "test", path: Path | None = None, max_context_turns: int = 3
) -> EvalSet:
    """`n` examples drawn with `seed`. More `max_context_turns` gives the same examples (and
    negatives), each with more of the turns before it."""
    pairs = load_pairs(split, max_context_turns=max_context_turns, path=path)
    rng = np.random.default_rng(seed)
    chosen = [pairs[i] for i in rng.choice(len(pairs), size=min(n, len(pairs)), replace=False)]
    if len(chosen) < CANDIDATES:
        raise ValueError(f"1-of-{CANDIDATES} needs at least {CANDIDATES} {split} examples, got {len(chosen)}")
    replies = [p.reply for p in chosen]
    keys = [normalize(r) for r in replies]
    negatives = np.empty((len(chosen), CANDIDATES - 1), dtype=np.int64)  # [N, 99]
    for i in range(len(chosen)):
        pool = rng.permutation(len(chosen))
        picked = [j for j in pool if j != i and keys[j] != keys[i]][: CANDIDATES - 1]
        negatives[i] = picked
    return EvalSet([list(p.context) for p in chosen], replies, negatives)


def ranks(context: np.ndarray, reply: np.ndarray, negatives: np.ndarray) -> np.ndarray:
    """context, reply: [N, D] unit rows; negatives [N, 99]. Returns the true reply's rank, 1-based, [N]."""
    positive = (context * reply).sum(axis=1)  # [N]
    negative = np.einsum("nd,nkd->nk", context, reply[negatives])  # [N, 99]
    return 1 + (negative > positive[:, None]).sum(axis=1)


def reranked_ranks(bi: np.ndarray, final: np.ndarray, depth: int) -> np.ndarray:
    """Rank of column 0 (the true reply) after reranking the bi-encoder's top `depth`.

    bi, final: [N, C]. A true reply outside the top `depth` keeps its bi-encoder rank."""
    bi_rank = 1 + (bi > bi[:, :1]).sum(axis=1)  # [N]
    column_rank = np.argsort(np.argsort(-bi, axis=1, kind="stable"), axis=1)  # [N, C], 0 = best
    in_top = column_rank < depth  # [N, C]
    reranked = 1 + ((final > final[:, :1]) & in_top).sum(axis=1)  # [N]
    return np.where(bi_rank <= depth, reranked, bi_rank)


def metrics(rank: np.ndarray) -> dict[str, float]:
    return {
        "r_at_1": round(float((rank == 1).mean()), 4),
        "r_at_10": round(float((rank <= 10).mean()), 4),
        "mrr": round(float((1.0 / rank).mean()), 4),
    }
