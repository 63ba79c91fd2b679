"""Stage 2, the student: 3 layers taken from alternate teacher layers
(DistilBERT, Small-BERT), with a poly head on top, trained in one pass over
the train pairs on four signals at once:

- in-batch negatives on the student's own scores (the task);
- in-batch negatives on the poly-reranked scores, so the encoder learns token
  outputs the codes can use (the poly-encoder paper trains both together);
- the teacher's in-batch score distribution (KL), on the student's own and on
  its poly-reranked scores, which passes on which negatives the teacher finds
  close (multi-task distillation, Dialog-BERT);
- the teacher's vectors themselves (1 - cosine), which pull a student that
  starts far from its optimum to the teacher's geometry.

The teacher's vectors are precomputed (`models/teacher_vectors.py`), so a
step costs the student's forward and backward passes only.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from models.batches import BatchPlan, Tokenise
from models.config import TrainConfig
from models.dataset import TrainPairs
from models.encoder import DualEncoder
from models.loop import run_steps
from models.losses import embedding_distillation, in_batch_negatives, score_distillation
from models.poly import PolyHead, rescore
from models.student import student_from
from models.teacher import optimiser
from models.teacher_vectors import TeacherVectors


def make_student(teacher: DualEncoder, cfg: TrainConfig) -> DualEncoder:
    torch.manual_seed(cfg.seed)
    student = student_from(teacher, cfg.student_layers)
    student.poly_head = PolyHead(student.dim, cfg.poly_codes)
    return student


def student_plan(pairs: TrainPairs, cfg: TrainConfig) -> tuple[BatchPlan, int]:
    """The student's batch order and its number of steps."""
    plan = BatchPlan(pairs.reply_keys, pairs.lengths, cfg.batch_size, cfg.length_group, cfg.seed + 1)
    steps = plan.steps(cfg.student_epochs)
    return plan, min(cfg.max_steps, steps) if cfg.max_steps else steps


def rows_seen(plan: BatchPlan, steps: int) -> list[int]:
    """Every train pair the student's steps will visit: the rows teacher vectors are needed for."""
    return sorted({row for step in range(steps) for row in plan.batch(step)})


def train_student(
    student: DualEncoder,
    teacher_vectors: TeacherVectors,
    pairs: TrainPairs,
    tok: Tokenise,
    cfg: TrainConfig,
    checkpoint: Path,
    device: str,
) -> dict[str, float]:
    assert student.poly_head is not None
    head = student.poly_head
    student.to(device)
    plan, steps = student_plan(pairs, cfg)
    teacher_context = torch.from_numpy(teacher_vectors.context)  # [N, D] float16
    teacher_reply = torch.from_numpy(teacher_vectors.reply)  # [N, D] float16

    def batch_loss(step: int) -> torch.Tensor:
        rows = plan.batch(step)
        contexts, replies = pairs.rows(rows)
        context, _, poly = student(*(t.to(device) for t in tok.contexts(contexts)))  # [B, D], _, [B, m, D]
        reply = student.encode_reply(*(t.to(device) for t in tok.replies(replies)))  # [B, D]
        t_context = F.normalize(teacher_context[rows].float().to(device), dim=-1)  # [B, D]
        t_reply = F.normalize(teacher_reply[rows].float().to(device), dim=-1)  # [B, D]
        bi = context @ reply.T  # [B, B]
        every_reply = reply[None].expand(len(rows), -1, -1)  # [B, B, D]: each context against the batch
        labels = torch.arange(len(rows), device=device)
        teacher_scores = t_context @ t_reply.T  # [B, B]
        reranked = rescore(head, bi, poly, every_reply)  # [B, B]
        task = in_batch_negatives(context, reply, cfg.scale)
        task_reranked = F.cross_entropy(cfg.scale * reranked, labels)
        scores = score_distillation(bi, teacher_scores, cfg.scale)
        # The poly head has capacity the 3-layer bi-encoder lacks (each reply
        # attends over m context vectors): pointing it at the teacher's ranking
        # gives the rerank a signal the bi-encoder cannot fully absorb.
        scores_reranked = score_distillation(reranked, teacher_scores, cfg.scale)
        vectors = embedding_distillation(context, t_context) + embedding_distillation(reply, t_reply)
        return (
            task
            + task_reranked
            + cfg.distill_weight * (scores + cfg.rerank_distill_weight * scores_reranked)
            + cfg.embedding_weight * vectors
        )

    opt = optimiser(student, cfg.student_lr, cfg.head_lr, list(head.parameters()))
    stats = run_steps(
        "student", {"model": student}, opt, steps, cfg.warmup_fraction, batch_loss, checkpoint, cfg.checkpoint_every
    )
    return {**stats, "epochs": round(steps / plan.per_epoch, 3), "poly_weight": round(float(head.weight.item()), 4)}
