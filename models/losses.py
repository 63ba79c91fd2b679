"""Training objectives, after sentence-transformers' MultipleNegativesRankingLoss."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def in_batch_negatives(context: torch.Tensor, reply: torch.Tensor, scale: float) -> torch.Tensor:
    """Cross-entropy of each context against every reply in the batch.

    context, reply: [B, D] unit vectors, row i of each is a true pair; the
    other B-1 replies are the negatives. scale turns cosines in [-1, 1] into
    logits sharp enough for softmax (20 in sentence-transformers).
    """
    scores = scale * context @ reply.T  # [B, B]
    labels = torch.arange(len(context), device=context.device)  # [B]
    return F.cross_entropy(scores, labels)


def both_ways_in_batch_negatives(context: torch.Tensor, reply: torch.Tensor, scale: float) -> torch.Tensor:
    """The mean of `in_batch_negatives` and its transpose: each reply must also pick its own context.

    The transposed term is what penalises a reply that sits close to every
    context (a generic "haha, same"): one-way, such a reply costs only the
    contexts it wrongly wins; both ways, it is a wrong answer for its own row too.
    """
    return (in_batch_negatives(context, reply, scale) + in_batch_negatives(reply, context, scale)) / 2


def score_distillation(student_scores: torch.Tensor, teacher_scores: torch.Tensor, scale: float) -> torch.Tensor:
    """KL from the teacher's in-batch score distribution to the student's.

    Both [B, B] cosines of every context against every reply in the batch.
    Matching the whole distribution passes on which negatives the teacher
    finds close, not only which reply is right.
    """
    student = F.log_softmax(scale * student_scores, dim=-1)  # [B, B]
    teacher = F.log_softmax(scale * teacher_scores, dim=-1)  # [B, B]
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")


def embedding_distillation(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """1 - cosine, averaged: student [B, D] towards teacher [B, D], both unit."""
    return (1 - (student * teacher).sum(dim=-1)).mean()
