"""What `make train` trains, in one dataclass, and the two profiles.

Stages end after a fixed number of optimiser steps, not a wall-clock budget:
with a fixed seed the same profile gives the same weights on any machine,
and a slower machine only takes longer (`models/train.py` records how long).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainConfig:
    profile: str
    # Passes over the ~101k train pairs (1,584 steps each at batch 64).
    teacher_epochs: float = 1.0
    student_epochs: float = 1.0
    batch_size: int = 64  # in-batch negatives: 63 per pair; a step costs linearly in it on a CPU
    # Batches are cut from groups of this many batches sorted by length, so a
    # batch pads little: measured 2.5 s against 3.1 s a teacher step here.
    length_group: int = 16
    teacher_lr: float = 5e-5  # body; measured here: 3e-5 for 100 steps lifted R@1 0.32 -> 0.39
    student_lr: float = 1e-4  # a 3-layer student starts further from its optimum
    head_lr: float = 1e-3  # zero-initialised residual heads and the poly head move faster than a body
    warmup_fraction: float = 0.05
    scale: float = 20.0  # cosine -> logit scale, as sentence-transformers' MNRL
    # Student loss = in-batch negatives (bi and poly-reranked scores)
    #   + distill_weight * KL to the teacher's in-batch scores
    #   + embedding_weight * (1 - cosine to the teacher's vectors), both sides.
    distill_weight: float = 1.0
    # ... and the same KL on the poly-reranked scores, relative to distill_weight.
    rerank_distill_weight: float = 1.0
    embedding_weight: float = 1.0
    max_context_tokens: int = 64  # 3 turns: median ~54 tokens; trained and served at the same length
    max_reply_tokens: int = 96  # candidates are capped at 280 characters, about 70 tokens
    max_context_turns: int = 3  # measured: 3 turns beat 1 (R@1 0.33 vs 0.30 zero-shot)
    student_layers: tuple[int, ...] = (1, 3, 5)  # alternate teacher layers, keeping the last
    poly_codes: int = 16  # m; 16 beat 64 on validation in the frozen-head runs, and costs less to serve
    rerank_depth: int = 50  # what serving reranks (Settings.rerank_depth)
    validation_examples: int = 1000  # 1-of-100 on the validation split, logged after each stage
    checkpoint_every: int = 100  # steps; a crash loses at most this much work
    max_steps: int = 0  # > 0 caps every stage (tests); 0: the epochs decide
    seed: int = 0
    threads: int = 0  # 0: torch's default, one per core


PROFILES = {
    # A smoke run on the real corpus: every stage, a few minutes.
    "quick": TrainConfig("quick", teacher_epochs=0.04, student_epochs=0.04, validation_examples=300),
    # The release run, sized to finish inside one working session on 2 shared
    # CPU cores (measured: 103 min of training, teacher steps 4-6 s, student
    # steps 2.3-3 s): a quarter teacher pass and three quarters of a student
    # pass from the teacher's precomputed vectors. A full teacher pass and two
    # student passes would take ~3.5 h here: the run for `--device cuda`.
    "full": TrainConfig("full", teacher_epochs=0.25, student_epochs=0.75),
}
