"""Encoder work for requests: tokenised on arrival, batched across requests
(`batcher.py`), run as one onnxruntime call per batch.

A `/reply` sends one job of up to two rows, its last turn and its joined
context, so each request costs one pass through the encoder however many
vectors it needs; `/similar` sends its texts the same way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from app.engine.batcher import Batcher
from app.engine.stats import Stages
from core.encoder import OUTPUT_NAMES, POLY_OUTPUT, Encoder, Side


@dataclass(frozen=True)
class EncodeJob:
    encoder: Encoder  # the request's bundle: jobs of one batch normally share it
    rows: list[list[int]]  # token ids, each tokenised for its side
    poly: bool  # whether the job needs the poly vectors of its rows (its contexts')
    sides: list[Side] | None = None  # each row's side; None: all contexts

    @property
    def tokens(self) -> int:
        """Unpadded: the batch budget's unit. Padding is not counted because the
        batch is not padded as one matrix: `Encoder.run_ids` sorts its rows by
        length and pads each group of similar lengths (within 1.25x + 4 tokens of
        its shortest) separately, so a batch's padded work stays under
        1.25 x this + 4 a row, whatever mix of jobs shares it."""
        return sum(len(r) for r in self.rows)


@dataclass(frozen=True)
class Encoded:
    vectors: np.ndarray  # [n, D] unit vectors, each row's on its side
    poly: np.ndarray | None  # [n, m, D] when the job asked for them


def run_jobs(jobs: Sequence[EncodeJob], stages: Stages | None = None) -> list[Encoded]:
    """One encoder call per encoder in the batch; results split back per job, in order."""
    results: list[Encoded | None] = [None] * len(jobs)
    by_encoder: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        by_encoder.setdefault(id(job.encoder), []).append(i)
    for indices in by_encoder.values():
        encoder = jobs[indices[0]].encoder
        poly = encoder.has_poly and any(jobs[i].poly for i in indices)
        sides = [side for i in indices for side in jobs[i].sides or ["context"] * len(jobs[i].rows)]  # [R]
        # Every row goes through the graph once; a reply-side row reads the reply output of that pass.
        replies = "reply" in sides
        outputs = (
            [OUTPUT_NAMES["context"]] + ([POLY_OUTPUT] if poly else []) + ([OUTPUT_NAMES["reply"]] if replies else [])
        )
        rows = [row for i in indices for row in jobs[i].rows]
        started = time.perf_counter()
        arrays = encoder.for_batch(len(indices)).run_ids(rows, outputs)  # [R, D], [R, m, D], [R, D]
        if stages is not None:
            stages.observe("encode", time.perf_counter() - started)
        vectors = arrays[0]  # [R, D]
        if replies:
            on_reply = np.array(sides) == "reply"  # [R]
            vectors[on_reply] = arrays[-1][on_reply]
        start = 0
        for i in indices:
            end = start + len(jobs[i].rows)
            results[i] = Encoded(vectors[start:end], arrays[1][start:end] if poly and jobs[i].poly else None)
            start = end
    return [r for r in results if r is not None]


EncoderQueue = Batcher[EncodeJob, Encoded]


def encoder_queue(max_tokens: int, max_wait_ms: float, max_pending: int, stages: Stages | None = None) -> EncoderQueue:
    run = partial(run_jobs, stages=stages)
    return Batcher(run, max_cost=max_tokens, max_wait_s=max_wait_ms / 1000, max_pending=max_pending)
