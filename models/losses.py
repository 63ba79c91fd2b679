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
