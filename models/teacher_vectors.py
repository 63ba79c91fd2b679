"""The teacher's vectors for every train pair, computed once.

Distillation then costs the student's steps only: no teacher forward pass per
batch. The exported int8 teacher encodes them through the serving runtime
(onnxruntime), several times faster here than a torch forward pass.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.bundle import open_bundle
from core.encoder import Encoder
from models.dataset import TrainPairs

CHUNK = 2048


@dataclass(frozen=True)
class TeacherVectors:
    context: np.ndarray  # [N, D] float16, row i for train pair i
    reply: np.ndarray  # [N, D] float16

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.stem}.tmp.npz")
        np.savez(tmp, context=self.context, reply=self.reply)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> TeacherVectors:
        with np.load(path) as saved:
            return cls(saved["context"], saved["reply"])


def encode_texts(encoder: Encoder, texts: list[str], side: str, label: str) -> np.ndarray:
    """[N, D] float16 vectors of `texts` on one side, longest-first batches, with a progress line."""
    out = np.empty((len(texts), encoder.dim), dtype=np.float16)  # [N, D]
    order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths batch with little padding
    started = time.perf_counter()
    for start in range(0, len(texts), CHUNK):
        rows = order[start : start + CHUNK]
        out[rows] = encoder.encode([texts[i] for i in rows], side)  # type: ignore[arg-type]
        done = min(len(texts), start + CHUNK)
        rate = done / max(1e-9, time.perf_counter() - started)
        print(f"\r[teacher vectors] {label}: {done}/{len(texts)} ({rate:.0f}/s)", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return out


def compute(teacher_bundle: Path, pairs: TrainPairs, rows: list[int]) -> TeacherVectors:
    """Vectors for the train pairs in `rows` (the ones the student will see); other rows stay zero."""
    encoder = Encoder(teacher_bundle, open_bundle(teacher_bundle))
    unique = list(dict.fromkeys(pairs.replies[i] for i in rows))
    reply_rows = {text: i for i, text in enumerate(unique)}
    replies = encode_texts(encoder, unique, "reply", "replies")  # [U, D]
    context = np.zeros((len(pairs), encoder.dim), dtype=np.float16)  # [N, D]
    reply = np.zeros_like(context)  # [N, D]
    context[rows] = encode_texts(encoder, [pairs.contexts[i] for i in rows], "context", "contexts")
    reply[rows] = replies[[reply_rows[pairs.replies[i]] for i in rows]]
    return TeacherVectors(context, reply)
