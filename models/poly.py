"""Poly-encoder head (Humeau et al., ICLR 2020), trained with the student.

m learned codes attend over the context's token outputs and give m context
vectors; each candidate's reply vector attends over those m vectors to build
its own context vector. The reranked score mixes that cosine with the
bi-encoder's: (1 - w) * bi + w * poly, w learned. Starting near w = 0 means
training starts from the bi-encoder's ranking and only has to improve it.

Trained jointly with the student encoder (`models/distill.py`), as the paper
trains its encoder with the codes. Tried before and not kept: a head over a
frozen student's cached token outputs gained +0.4 R@1 on test, and the
bi-encoder's own top-8 wrong replies as hard negatives cut validation R@1
after rerank from 0.387 to 0.296 (in chit-chat those are mostly acceptable
replies too).
`core/reranker.py` is the numpy twin of `rescore` below.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PolyHead(nn.Module):
    def __init__(self, dim: int, codes: int) -> None:
        super().__init__()
        # Unit-variance codes, as the paper's embedding init: attention starts
        # mildly peaked and different per code. Tiny codes would start every
        # vector as the same mean pool, and identical vectors get identical
        # gradients, so they would separate only slowly.
        self.codes = nn.Parameter(torch.randn(codes, dim))  # [m, H]
        self.project = nn.Linear(dim, dim)  # token space -> reply-vector space
        nn.init.eye_(self.project.weight)
        nn.init.zeros_(self.project.bias)
        self.mix = nn.Parameter(torch.tensor(-2.0))  # sigmoid(-2) = 0.12: mostly the bi-encoder at first

    @property
    def num_codes(self) -> int:
        return int(self.codes.shape[0])

    @property
    def weight(self) -> torch.Tensor:
        return torch.sigmoid(self.mix)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # hidden: [B, T, H], attention_mask: [B, T] -> [B, m, H]
        logits = torch.einsum("mh,bth->bmt", self.codes, hidden) / hidden.shape[-1] ** 0.5  # [B, m, T]
        logits = logits.masked_fill(attention_mask[:, None, :] == 0, -1e4)
        attended = torch.einsum("bmt,bth->bmh", logits.softmax(dim=-1), hidden)  # [B, m, H]
        return self.project(attended)  # [B, m, H]


def poly_scores(vectors: torch.Tensor, replies: torch.Tensor) -> torch.Tensor:
    # vectors: [B, m, H], replies: [B, C, H] unit rows -> [B, C] cosines
    attention = torch.einsum("bch,bmh->bcm", replies, vectors).softmax(dim=-1)  # [B, C, m]
    context = torch.einsum("bcm,bmh->bch", attention, vectors)  # [B, C, H]
    return (F.normalize(context, dim=-1, eps=1e-12) * replies).sum(dim=-1)


def rescore(head: PolyHead, bi: torch.Tensor, vectors: torch.Tensor, replies: torch.Tensor) -> torch.Tensor:
    # bi: [B, C] bi-encoder cosines of the same candidates -> [B, C]
    w = head.weight
    return (1 - w) * bi + w * poly_scores(vectors, replies)
