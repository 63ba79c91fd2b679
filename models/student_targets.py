"""What the student is trained on, and its teachers' vectors for it, computed once.

Two teachers encode every text the student's steps will visit, through the
serving runtime (int8 ONNX, several times faster here than torch):

- the tuned multilingual-e5-small (the teacher bundle), with its own
  prefixes: "query: " on contexts, "passage: " on replies, and both on each
  broad text, since the student's context and reply heads each learn one;
- all-MiniLM-L6-v2, English only: a second opinion on which English replies
  fit a context and which sentences mean alike, where e5-small is weaker out
  of domain (reports/ood.md).

Rows the steps never visit stay zero. The arrays go to one .npz that a rerun
loads instead of encoding again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.bundle import open_bundle
from core.encoder import Encoder
from models.batches import BatchPlan
from models.broad_text import BroadText, broad_text
from models.dataset import TURN_SEPARATOR, TrainPairs, train_pairs
from models.teacher_vectors import encode_texts
from models.written_korean import TRANSLATED, WRITTEN, written_korean_pairs


@dataclass(frozen=True)
class StudentData:
    english: TrainPairs  # chitchat train pairs, turns joined with the student's separator
    english_minilm_contexts: list[str]  # the same contexts joined as MiniLM's bundle joins them
    korean: TrainPairs  # our written and translated Korean pairs
    broad: BroadText

    @classmethod
    def load(cls, max_context_turns: int, separator: str, seed: int) -> StudentData:
        english = train_pairs(max_context_turns, separator=separator)
        minilm = train_pairs(max_context_turns, separator=TURN_SEPARATOR)
        if minilm.replies != english.replies:
            raise ValueError("the two joins of the train pairs are not row-aligned")
        korean = written_korean_pairs(max_context_turns, separator, WRITTEN)
        korean += written_korean_pairs(max_context_turns, separator, TRANSLATED)
        return cls(english, minilm.contexts, korean, broad_text(seed))


@dataclass(frozen=True)
class Schedule:
    """Which batch each step takes: Korean pairs every `korean_every`-th step, English chitchat
    pairs otherwise, and a broad batch every step. A pure function of the step."""

    english: BatchPlan
    korean: BatchPlan
    broad: BroadText
    korean_every: int
    broad_size: int

    def is_korean(self, step: int) -> bool:
        return self.korean_every > 0 and step % self.korean_every == self.korean_every - 1

    def pairs(self, step: int) -> list[int]:
        if self.is_korean(step):
            return self.korean.batch(step // self.korean_every)
        korean_before = (step + 1) // self.korean_every if self.korean_every else 0
        return self.english.batch(step - korean_before)

    def broad_rows(self, step: int) -> list[int]:
        return self.broad.batch(step, self.broad_size)

    def seen(self, steps: int) -> tuple[list[int], list[int], list[int]]:
        """Sorted rows of (English pairs, Korean pairs, broad texts) that `steps` steps visit."""
        english: set[int] = set()
        korean: set[int] = set()
        for step in range(steps):
            (korean if self.is_korean(step) else english).update(self.pairs(step))
        return sorted(english), sorted(korean), self.broad.rows_seen(steps, self.broad_size)


VECTOR_NAMES = (
    "english_context",  # [N_en, D] e5, query side
    "english_reply",  # [N_en, D] e5, passage side
    "korean_context",  # [N_ko, D]
    "korean_reply",  # [N_ko, D]
    "broad_query",  # [N_b, D] e5, each broad text as a query
    "broad_passage",  # [N_b, D] ... and as a passage
    "minilm_english_context",  # [N_en, D'] MiniLM
    "minilm_english_reply",  # [N_en, D']
    "minilm_broad",  # [N_b, D'] English broad texts only (reply side: cut on the right, as prose reads)
)


def _fill(rows: int, dim: int, seen: list[int], vectors: np.ndarray) -> np.ndarray:
    out = np.zeros((rows, dim), dtype=np.float16)  # [N, D]
    out[seen] = vectors
    return out


def compute(data: StudentData, schedule: Schedule, steps: int, e5: Path, minilm: Path) -> dict[str, np.ndarray]:
    """Every teacher vector the first `steps` steps need; see VECTOR_NAMES."""
    started = time.perf_counter()
    english, korean, broad = schedule.seen(steps)
    english_broad = [r for r in broad if data.broad.english_rows()[r]]
    texts = data.broad.texts
    teacher = Encoder(e5, open_bundle(e5))
    judge = Encoder(minilm, open_bundle(minilm))
    n_en, n_ko, n_b = len(data.english), len(data.korean), len(texts)
    d, dm = teacher.dim, judge.dim

    def e5_side(pairs: TrainPairs, rows: list[int], side: str, label: str) -> np.ndarray:
        source = pairs.contexts if side == "context" else pairs.replies
        return encode_texts(teacher, [source[i] for i in rows], side, label)

    vectors = {
        "english_context": _fill(n_en, d, english, e5_side(data.english, english, "context", "e5 contexts")),
        "english_reply": _fill(n_en, d, english, e5_side(data.english, english, "reply", "e5 replies")),
        "korean_context": _fill(n_ko, d, korean, e5_side(data.korean, korean, "context", "e5 Korean contexts")),
        "korean_reply": _fill(n_ko, d, korean, e5_side(data.korean, korean, "reply", "e5 Korean replies")),
        "broad_query": _fill(n_b, d, broad, encode_texts(teacher, [texts[i] for i in broad], "context", "e5 broad")),
        "broad_passage": _fill(n_b, d, broad, encode_texts(teacher, [texts[i] for i in broad], "reply", "e5 broad")),
        "minilm_english_context": _fill(
            n_en,
            dm,
            english,
            encode_texts(judge, [data.english_minilm_contexts[i] for i in english], "context", "MiniLM"),
        ),
        "minilm_english_reply": _fill(
            n_en, dm, english, encode_texts(judge, [data.english.replies[i] for i in english], "reply", "MiniLM")
        ),
        "minilm_broad": _fill(
            n_b, dm, english_broad, encode_texts(judge, [texts[i] for i in english_broad], "reply", "MiniLM")
        ),
    }
    print(f"[student targets] {len(english)} + {len(korean)} pairs, {len(broad)} broad texts in "
          f"{time.perf_counter() - started:.0f}s")  # fmt: skip
    return vectors


def save(vectors: dict[str, np.ndarray], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.npz")
    np.savez(tmp, **vectors)
    tmp.replace(path)


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as saved:
        return {name: saved[name] for name in VECTOR_NAMES}
